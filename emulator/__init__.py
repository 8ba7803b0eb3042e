"""stockade.emulator — a local Managed Agents Sessions API (spec/api.md) driven by scenario scripts.

Python API::

    from stockade.emulator import Emulator, Scenario

    with Emulator(Scenario.load("s.toml"), api_key="k") as emu:      # or a dict, a path, or a list
        client = anthropic.Anthropic(api_key="k", base_url=emu.base_url, max_retries=0)
        ...
        emu.wait_until_finished(sid, timeout=10)    # the script ran its last step (ScriptFailed if not)
        emu.posted_events(sid)                      # accepted posts, as stored (server ids)
        emu.requests(sid, endpoint="send")          # RecordedRequest: method, path, query, headers, body,
                                                    #   time, monotonic, endpoint, session_id, status, fault
        emu.events(sid); emu.status(sid); emu.open_streams(sid); emu.wait_for_posted(sid, 2, timeout=5)
        emu.wait_for_events(sid, 3, timeout=5)
        emu.add_session({...}); emu.emit(sid, {"type": "agent.message", ...}); emu.add_fault(sid, {...})
        emu.drop_streams(sid, "reset"); emu.archive(sid); emu.dump_record_json(path=None)

    serve(scenarios, host, port, on_ready)          # foreground, until Ctrl-C; on_ready(emulator)

Endpoints: `GET /v1/sessions/{id}`, `GET|POST /v1/sessions/{id}/events`, `GET .../events/stream`.
Auth: `x-api-key` or `Authorization: Bearer` (any key when `api_key=None`); `anthropic-beta` must contain
`managed-agents-2026-04-01`. Unknown sessions → 404. Status = the latest `session.status_*` event
(idle before any; archived → terminated). A stream carries only events emitted after it opened; it sends
`: ping` comments every `keepalive_s`, and closes after `session.status_terminated` / `session.deleted`.

Scenario format (TOML shown; JSON and Python dicts have the same structure)::

    id = "sesn_demo"        # optional (generated: sesn_000001 ...)
    title = "demo"          # optional
    start = "history"       # when the live steps start: "history" (default: once a client with an open
                            # stream has read the last history page), "stream" (first stream opens), "now"
    seed = 0                # seeds rate-based faults
    keepalive_s = 15.0      # SSE keepalive comment interval
    reactions = true        # server reactions to posted results/confirmations (below)
    strict_results = true   # a result for an already-answered call → 400
    archived = false        # start archived (status terminated, no event)

    history = [             # pre-existing events, applied at once: raw events or event-producing steps
      {type = "user.message", content = [{type = "text", text = "hi"}]},
      {tool_use = "bash", id = "tu_old", input = {command = "ls"}},
    ]

    [[steps]]                                   # one kind key per step, plus that kind's options
    tool_use = "bash"                           # agent.tool_use named "bash"
    id = "tu_1"                                 # event id (tests refer to it); generated when absent
    input = {command = "ls"}
    permission = "allow"                        # allow | ask | deny | none (no evaluated_permission) | any
                                                # other string (sent as is, to test fail-closed clients)
    # thread = "sthr_1"                         # a subagent thread's call (session_thread_id)
    # requires_action = true                    # follow with an idle requires_action listing the blockers
                                                # (default true for ask/none); deny emits agent.tool_result
    [[steps]]
    wait = ["tu_1"]                             # block until results for these ids exist ("all" = every
    timeout_s = 10                              # unanswered call); on_timeout = "fail" (default) | "continue"

Step kinds (options in brackets):

- `emit = {type = ..., ...}` raw event (a step table with a `type` key is the same); `message = "text"`
  [thread] → `agent.message`.
- `tool_use = NAME` [id, input, permission, thread, requires_action, deny_message];
  `custom_tool_use = NAME` [id, input, thread, requires_action (default true)] → `agent.custom_tool_use`
  then `requires_action` idle listing every blocker of its thread (thread calls get
  `session.thread_status_idle`). Set `requires_action = false` on all but the last call of a batch.
- `idle = end_turn|requires_action|retries_exhausted|budget_reached|refusal|...` [event_ids (default: the
  blockers, for requires_action), stop_details, id]; `running = true` [id]; `rescheduled = true` [id].
- `confirm = CALL_ID` [result = allow|deny, deny_message] and `answer = CALL_ID` [content (string or
  blocks), is_error]: a confirmation or result from *another client* (reactions apply).
- `thread_created = THREAD_ID` [agent_name]; `thread_running`, `thread_terminated` = THREAD_ID;
  `thread_idle = THREAD_ID` [stop_reason (default end_turn), event_ids].
- `terminate = true` [id]; `delete = true` [id]; `archive = true` (no event; status → terminated).
- `wait = [ids] | "all"` [timeout_s = 30, on_timeout]; `sleep = SECONDS`.
- `drop_stream = eof|reset|stall|error_frame|malformed|json_array` (acts on the open streams now);
  `fault = {...}` (arms a fault, as in `[[faults]]`, from this point on).

Reactions (api.md §8), when a posted (or scripted) result or confirmation resolves a call that blocked
its thread: a `deny` confirmation appends `agent.tool_result{is_error}`; then, if blockers remain, a new
`requires_action` idle lists them, else `session.status_running` (`session.thread_status_running`).
Posted bodies are validated: unknown/mismatched ids, wrong result kind, a second result (strict_results),
a result for a terminated thread's call, unknown fields, bad content → 400 with the real server's messages.

Faults (`[[faults]]`, `fault = {...}` steps, or `emu.add_fault(sid, {...})`): one action key, plus
`on = stream|list|retrieve|send|any`, `after = N` (skip N matching requests), `times = N|"always"`
(default 1; "always" with `rate`), `rate = 0.0..1.0` (seeded), `page = N` (list: 1-based page)::

    {on = "send", status = 503, times = 2}                    # JSON API error; error_type, message,
    {on = "list", status = 429, retry_after_s = 1}            #   retry_after_s, retry_after_ms, should_retry
    {on = "list", page = 2, status = 500}                     # the second history page fails once
    {on = "retrieve", non_json = true}                        # 200 text/html proxy page
    {on = "any", delay_s = 2}                                 # answer late (also delays stream headers)
    {stream = "eof", after_events = 3}                        # stream faults (on = "stream" implied):
    {stream = "reset"} {stream = "stall"} {stream = "error_frame"} {stream = "malformed"}
    {stream = "json_array"}                                   # a data frame that is a JSON array
    {on = "send", non_json = true}                            # 200 text/html reply to a result POST
    {no_match = true, times = 2}                              # 400 "`tool_use_id` ... does not match any
                                                              #   `agent.tool_use` event" (#1744)
    {on = "send", status = 413}                               # request_too_large
    {duplicate = "tu_1"}                                      # delivered twice on streams
    {duplicate = "tu_1", in_history = true}                   #   ... and listed twice
    {missing = "tu_1", times = 1}                             # left out of the next history read(s)

Faults on the session's resources name their endpoint (`any` does not match them): `on =
skill_retrieve|skill_download|memory_list|memory_retrieve|memory_create|memory_update|memory_delete`.

Resources (`stockade.emulator.resources`): `[[skills]]` (`skill_id`, `name`, `version`, `files = {path =
text}` served as a zip wrapped in `<name>/`, or raw `archive_b64`; `subagent = true` puts it on a
coordinator's subagent) and `[[memory_stores]]` (`memory_store_id`, `name`, `access = read_write|read_only`,
`mount_path`, `memories = {"/path" = text}`), listed on the session and served at `/v1/skills/...` and
`/v1/memory_stores/{id}/memories[/{memory_id}]` (preconditions → 409); `emu.resources.store(id).contents()`.

Errors: see `stockade.emulator.errors` (EmulatorError > ScenarioError, ScriptFailed).
"""

from stockade.emulator.errors import EmulatorError, ScenarioError, ScriptFailed
from stockade.emulator.record import RecordedRequest
from stockade.emulator.scenario import Scenario, Step, demo_scenario
from stockade.emulator.server import Emulator, serve

__all__ = [
    "Emulator",
    "EmulatorError",
    "RecordedRequest",
    "Scenario",
    "ScenarioError",
    "ScriptFailed",
    "Step",
    "demo_scenario",
    "serve",
]
