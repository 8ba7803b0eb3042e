"""`Emulator`: the Sessions API emulator as a context manager, plus `serve()` for the CLI.

The server binds loopback port 0 by default and starts in milliseconds; every request thread, stream and
script thread is stopped and joined on `close()`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from stockade.emulator.errors import EmulatorError
from stockade.emulator.faults import parse_fault
from stockade.emulator.http import EmulatorHTTPServer, ServerContext
from stockade.emulator.messages import MessagesScript, MessagesState
from stockade.emulator.record import RecordedRequest
from stockade.emulator.resources import ResourceBook
from stockade.emulator.scenario import Scenario
from stockade.emulator.script import ScriptRunner, run_step
from stockade.emulator.session import SessionState
from stockade.emulator.work import DEFAULT_TTL_S, WorkItem, WorkQueues

__all__ = ["Emulator", "ScenarioLike", "serve"]

log = logging.getLogger(__name__)

ScenarioLike = Scenario | dict[str, Any] | str | Path
SHUTDOWN_POLL_S = 0.02
"""How often the accept loop checks for shutdown (bounds how long `close()` takes)."""
JOIN_TIMEOUT_S = 5.0
"""Upper bound on waiting for one thread at shutdown (streams notice shutdown within 0.1 s)."""


def _as_scenario(item: ScenarioLike) -> Scenario:
    if isinstance(item, Scenario):
        return item
    if isinstance(item, dict):
        return Scenario.from_dict(item)
    return Scenario.load(item)


def _as_list(scenarios: ScenarioLike | Iterable[ScenarioLike] | None) -> list[ScenarioLike]:
    if scenarios is None:
        return []
    if isinstance(scenarios, Scenario | dict | str | Path):
        return [scenarios]
    return list(scenarios)


class Emulator:
    """A running Sessions API emulator: `with Emulator(scenarios, api_key="k") as emu: emu.base_url`.

    `api_key=None` accepts any non-empty key; otherwise only `api_key` and `extra_api_keys` are valid.
    """

    def __init__(
        self,
        scenarios: ScenarioLike | Iterable[ScenarioLike] | None = None,
        *,
        api_key: str | None = None,
        extra_api_keys: Iterable[str] = (),
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        keys = None if api_key is None else frozenset({api_key, *extra_api_keys})
        self._context = ServerContext(sessions={}, api_keys=keys)
        self._scripts: dict[str, ScriptRunner] = {}
        self._lock = threading.Lock()
        self._http = EmulatorHTTPServer((host, port), self._context)
        self._serve_thread = threading.Thread(
            target=self._http.serve_forever, args=(SHUTDOWN_POLL_S,), name="emulator-http", daemon=True
        )
        for item in _as_list(scenarios):
            self.add_session(item)

    # ----- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> Emulator:
        """Start serving (idempotent)."""
        if not self._serve_thread.is_alive():
            self._serve_thread.start()
            log.info("emulator_started base_url=%s sessions=%d", self.base_url, len(self._context.sessions))
        return self

    def close(self) -> None:
        """Stop serving; end every stream and script and join their threads."""
        self._context.closing.set()
        if self._serve_thread.is_alive():
            self._http.shutdown()
            self._serve_thread.join(JOIN_TIMEOUT_S)
        self._http.server_close()
        for script in self._scripts.values():
            script.join(JOIN_TIMEOUT_S)
        log.info("emulator_stopped requests=%d", len(self.requests()))

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        """`http://host:port` of the server (give it to the client as `base_url`)."""
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    # ----- sessions ------------------------------------------------------------------------------------

    def add_session(self, scenario: ScenarioLike) -> str:
        """Add a scripted session (also while running); returns its session id."""
        parsed = _as_scenario(scenario)
        session = SessionState(parsed, self._context.ids)
        with self._lock:
            if session.session_id in self._context.sessions:
                raise EmulatorError(f"session {session.session_id} already exists")
            self._context.resources.add(session.session_id, parsed.skills, parsed.memory_stores)
            for step in parsed.history:
                run_step(session, step)
            self._context.sessions[session.session_id] = session
            script = ScriptRunner(session, self._context.closing)
            self._scripts[session.session_id] = script
        script.start()
        return session.session_id

    def add_messages_script(self, script: MessagesScript) -> MessagesState:
        """Answer `POST /v1/messages` with `script`'s assistant turns; the state records the requests."""
        self._context.messages = MessagesState(script)
        return self._context.messages

    def add_environment(
        self, environment_id: str, sessions: Iterable[ScenarioLike], ttl_s: int = DEFAULT_TTL_S
    ) -> list[WorkItem]:
        """Add each session and queue one work item for it in `environment_id`; returns the items."""
        return [self._context.work.enqueue(environment_id, self.add_session(s), ttl_s) for s in sessions]

    @property
    def work(self) -> WorkQueues:
        """The environments' work queues (inspect items; inject lease loss with `lose_lease` etc.)."""
        return self._context.work

    @property
    def resources(self) -> ResourceBook:
        """Sessions' skills and memory stores (read a store's `contents()` after a run)."""
        return self._context.resources

    def session(self, session_id: str) -> SessionState:
        """The live state of a session (raises `EmulatorError` for an unknown id)."""
        try:
            return self._context.sessions[session_id]
        except KeyError:
            raise EmulatorError(f"unknown session {session_id}") from None

    @property
    def session_ids(self) -> list[str]:
        """Ids of all sessions, in the order they were added."""
        return list(self._context.sessions)

    def emit(self, session_id: str, event: dict[str, Any]) -> dict[str, Any]:
        """Inject an event live (id and processed_at filled in when absent); returns the stored event."""
        return self.session(session_id).append(dict(event))

    def add_fault(self, session_id: str, fault: dict[str, Any]) -> None:
        """Arm a fault (same table as a scenario's `[[faults]]`) from now on."""
        self.session(session_id).faults.add(parse_fault(fault, "add_fault"))

    def drop_streams(self, session_id: str, action: str = "eof") -> None:
        """Apply a stream fault (`eof`, `reset`, `stall`, `error_frame`, `malformed`) to open streams now."""
        self.session(session_id).signal_streams("action", action)

    def archive(self, session_id: str) -> None:
        """Archive a session: no event; its status becomes `terminated`."""
        self.session(session_id).archive()

    # ----- observing -----------------------------------------------------------------------------------

    def events(self, session_id: str) -> list[dict[str, Any]]:
        """The session's whole event log (its history), oldest first."""
        return self.session(session_id).events()

    def posted_events(self, session_id: str) -> list[dict[str, Any]]:
        """Events clients posted and the API accepted, as stored (with server ids), in order."""
        with self.session(session_id).changed:
            return list(self.session(session_id).posted)

    def requests(
        self, session_id: str | None = None, endpoint: str | None = None, method: str | None = None
    ) -> list[RecordedRequest]:
        """Recorded requests, filtered by session, endpoint (`retrieve|list|send|stream|other`), method."""
        return sorted(
            self._context.recorder.requests(session_id, endpoint, method), key=lambda r: r.monotonic
        )

    def status(self, session_id: str) -> str:
        """The session's current status (`idle`, `running`, `rescheduling`, `terminated`)."""
        return self.session(session_id).status()

    def open_streams(self, session_id: str) -> int:
        """How many stream connections of the session are open."""
        return self.session(session_id).open_streams()

    def wait_until_finished(self, session_id: str, timeout: float) -> None:
        """Wait for the session's script to run its last step; raise `ScriptFailed` or `TimeoutError`."""
        script = self._scripts[self.session(session_id).session_id]
        if not script.finished.wait(timeout):
            raise TimeoutError(f"script of session {session_id} still running after {timeout}s")
        if script.failure is not None:
            raise script.failure

    def wait_for_posted(self, session_id: str, count: int, timeout: float) -> list[dict[str, Any]]:
        """Wait until at least `count` events were posted; return them (raise `TimeoutError` if not)."""
        session = self.session(session_id)
        if not session.wait_until(lambda: len(session.posted) >= count, timeout, self._context.closing):
            raise TimeoutError(
                f"{len(session.posted)} of {count} events posted to {session_id} after {timeout}s"
            )
        return self.posted_events(session_id)

    def wait_for_events(self, session_id: str, count: int, timeout: float) -> list[dict[str, Any]]:
        """Wait until the session's log holds at least `count` events; return the log."""
        session = self.session(session_id)
        if not session.wait_until(lambda: len(session.events()) >= count, timeout, self._context.closing):
            raise TimeoutError(f"{len(session.events())} of {count} events in {session_id} after {timeout}s")
        return session.events()

    def record_json(self) -> dict[str, Any]:
        """The record as JSON-ready data: every request, and per session the posted events and log."""
        sessions = {
            sid: {"status": s.status(), "posted_events": list(s.posted), "events": s.events()}
            for sid, s in self._context.sessions.items()
        }
        return {"requests": [r.to_json() for r in self.requests()], "sessions": sessions}

    def dump_record_json(self, path: str | Path | None = None) -> str:
        """The record as a JSON string (written to `path` too, when given)."""
        text = json.dumps(self.record_json(), indent=2)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text


def serve(
    scenarios: ScenarioLike | Iterable[ScenarioLike] | None,
    host: str = "127.0.0.1",
    port: int = 0,
    on_ready: Callable[[Emulator], None] | None = None,
    *,
    api_key: str | None = None,
    stop: threading.Event | None = None,
) -> Emulator:
    """Run an emulator in the foreground until interrupted (Ctrl-C) or `stop` is set; prints nothing.

    `on_ready(emulator)` runs once the server accepts connections (the CLI prints `emulator.base_url`).
    Returns the closed emulator, whose record (`dump_record_json()`) is still readable.
    """
    stop = stop or threading.Event()
    emulator = Emulator(scenarios, api_key=api_key, host=host, port=port)
    with emulator:
        if on_ready is not None:
            on_ready(emulator)
        try:
            stop.wait()
        except KeyboardInterrupt:
            log.info("emulator_interrupted")
    return emulator
