"""`stockade serve` with skills and memory stores: a real serve process, real sandboxed workers, the
emulator's skills and memory endpoints over loopback."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stockade.emulator import Emulator

ENV_ID = "env_memory"
EXIT_TIMEOUT_S = 20.0

# Finds a store folder where either worker put it: the SDK under `{workdir}/memory/<name>`,
# stockade beside the workdir in `{workdir}.memory/<name>` (so read-only really is read-only).
_FIND = 'm() { for d in "$PWD/memory/$1" "$PWD.memory/$1"; do [ -d "$d" ] && echo "$d" && return; done; }'

COMMAND = "; ".join(
    [
        _FIND,
        "N=$(m notes); R=$(m ref)",
        "cat skills/pdf/SKILL.md; echo",
        "cat skills/helper/SKILL.md; echo",
        "ls skills",
        "echo edited-a > $N/a.md",
        "echo conflict-local > $N/c.md",
        "rm $N/b.md",
        "mkdir -p $N/sub && echo new > $N/sub/new.md",
        "(echo tampered > $R/r.md) 2>/dev/null && echo ro-written || echo ro-refused",
        "(echo outside > $N/../outside.md) 2>/dev/null; echo outside > $PWD/stray.md",
        "ln -s /etc/hostname $N/leak.md",
    ]
)


def _hostile_archive() -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        for name in ("evil/SKILL.md", "../../escaped.md"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tf.addfile(info, io.BytesIO(b"evil"))
    return base64.b64encode(buffer.getvalue()).decode()


def scenario(sid: str) -> dict[str, Any]:
    """The session (see the module docstring); the test edits `c.md` on the server during the sleep."""
    return {
        "id": sid,
        "skills": [
            {"skill_id": "skill_pdf", "name": "pdf", "files": {"SKILL.md": "pdf-skill"}},
            {"skill_id": "skill_evil", "name": "evil", "archive_b64": _hostile_archive()},
            {"skill_id": "skill_helper", "name": "helper", "files": {"SKILL.md": "helper"}, "subagent": True},
        ],
        "memory_stores": [
            {
                "memory_store_id": f"memstore_{sid}",
                "name": "notes",
                "memories": {"/a.md": "alpha\n", "/b.md": "beta\n", "/c.md": "gamma\n"},
            },
            {
                "memory_store_id": f"memstore_ro_{sid}",
                "name": "ref",
                "access": "read_only",
                "memories": {"/r.md": "reference\n"},
            },
        ],
        "steps": [
            {"running": True},
            {"tool_use": "bash", "id": f"tu_{sid}", "input": {"command": COMMAND}},
            {"wait": [f"tu_{sid}"], "timeout_s": 30},
            {"sleep": 1.5},
            {"terminate": True},
        ],
    }


def expected_notes(deletions: str) -> dict[str, str]:
    """The writable store on the server afterwards: a edited, c the server's (conflict), sub/new created."""
    notes = {"/a.md": "edited-a\n", "/c.md": "server-c\n", "/sub/new.md": "new\n"}
    if deletions != "enabled":
        notes["/b.md"] = "beta\n"
    return notes


@pytest.fixture
def root() -> Iterator[Path]:
    """The serve workdir root: a fresh /tmp folder, as `stockade serve` makes by default."""
    path = Path(tempfile.mkdtemp(prefix="stockade-memtest-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator(api_key=None) as emulator:
        yield emulator


def _serve(
    emu: Emulator, root: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    environ = {**os.environ, "ANTHROPIC_ENVIRONMENT_KEY": "env-key", "ANTHROPIC_BASE_URL": emu.base_url}
    environ.pop("ANTHROPIC_API_KEY", None)
    environ.update(env or {})
    argv = [sys.executable, "-m", "stockade.supervisor", "serve", "-v", "--workdir", str(root), *extra]
    argv += ["--tools", "stockade.tools.builtin:agent_toolset", "--max-idle", "5"]
    return subprocess.Popen(argv, cwd=root.parent, env=environ, stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"serve did not exit after SIGTERM:\n{err}")
    assert proc.returncode == 0, err
    return err


def run_with_emulator(emu: Emulator, sid: str, root: Path, *extra: str) -> tuple[str, str]:
    """Serve the shared scenario; edit `c.md` on the server once the call's result is in. (output, logs)"""
    (item,) = emu.add_environment(ENV_ID, [scenario(sid)])
    proc = _serve(emu, root, "--environment-id", ENV_ID, *extra)
    try:
        posted = emu.wait_for_posted(sid, 1, 30)
        emu.resources.put(f"memstore_{sid}", "/c.md", "server-c\n")
        assert emu.work.wait_until(lambda: emu.work.item(item.id).state == "stopped", 30)
    finally:
        err = _stop(proc)
    return _text(posted[0]), err


def _text(event: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in event["content"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("deletions", ["enabled", "log_only", "disabled"])
def test_skills_and_memory_stores_round_trip_as_with_the_sdk_worker(
    emu: Emulator, root: Path, tmp_path: Path, deletions: str
) -> None:
    sid = f"sesn_ours_{deletions}"
    output, logs = run_with_emulator(emu, sid, root, "--memory-sync-deletions", deletions)
    # Skills: unpacked before the call, the subagent's too; the hostile archive refused, not blocking.
    assert "pdf-skill" in output and "helper" in output, output
    assert "evil" not in output.split("ls skills")[-1] or "skill_failed" in logs
    assert "skill_failed skill_id=skill_evil" in logs
    assert not (root / "escaped.md").exists() and not (root.parent / "escaped.md").exists()
    # The read-only store is read-only in the kernel, not just never pushed.
    assert "ro-refused" in output, output
    assert emu.resources.store(f"memstore_{sid}").contents() == expected_notes(deletions)
    assert emu.resources.store(f"memstore_ro_{sid}").contents() == {"/r.md": "reference\n"}
    # Nothing outside the folders, and no symlink target, reached the server.
    assert "memory_conflict" in logs
    # Everything a session had on disk is gone afterwards.
    assert sorted(os.listdir(root)) == []
    # The SDK's environment worker on the same scenario ends the same way.
    sdk_dir = tmp_path / "sdk"
    sdk_dir.mkdir()
    theirs = _run_sdk_worker(emu, f"sesn_sdk_{deletions}", sdk_dir, deletions)
    # The SDK's bash is not sandboxed: it can write the read-only store's folder (and never pushes it);
    # stockade's kernel refuses the write. Everything else in the result is the same.
    assert output.replace("ro-refused", "ro-?") == theirs.replace("ro-written", "ro-?"), (output, theirs)
    for prefix in ("memstore_", "memstore_ro_"):
        mine = emu.resources.store(f"{prefix}{sid}").contents()
        sdk = emu.resources.store(f"{prefix}sesn_sdk_{deletions}").contents()
        assert mine == sdk, (prefix, mine, sdk)
    assert emu.resources.store(f"memstore_sesn_sdk_{deletions}").contents() == expected_notes(deletions)


@pytest.mark.timeout(60)
def test_no_skills_and_no_memory(emu: Emulator, root: Path) -> None:
    sid = "sesn_mem_off"
    output, _ = run_with_emulator(emu, sid, root, "--no-skills", "--memory-sync-interval", "off")
    assert "pdf-skill" not in output, output
    assert "ro-" in output, output
    assert emu.resources.store(f"memstore_{sid}").contents() == {
        "/a.md": "alpha\n",
        "/b.md": "beta\n",
        "/c.md": "server-c\n",
    }
    assert not emu.requests(endpoint="memory_list")


@pytest.mark.timeout(60)
def test_failing_memory_endpoint_fails_the_item_clearly(emu: Emulator, root: Path) -> None:
    sid = "sesn_mem_fault"
    spec = scenario(sid)
    spec["faults"] = [{"on": "memory_list", "status": 400, "times": "always"}]
    (item,) = emu.add_environment(ENV_ID, [spec])
    proc = _serve(emu, root, "--environment-id", ENV_ID)
    try:
        assert emu.work.wait_until(lambda: emu.work.item(item.id).state == "stopped", 30)
    finally:
        logs = _stop(proc)
    assert "item_resources_failed" in logs
    assert not [e for e in emu.posted_events(sid) if e["type"] == "user.tool_result"]


def _run_sdk_worker(emu: Emulator, sid: str, workdir: Path, deletions: str) -> str:
    """The SDK's environment worker on the same scenario; returns the posted result's text."""
    import anthropic

    (item,) = emu.add_environment(ENV_ID, [scenario(sid)])

    async def main() -> None:
        client = anthropic.AsyncAnthropic(api_key="unused", base_url=emu.base_url)
        worker = client.beta.environments.work.worker(
            environment_id=ENV_ID,
            environment_key="env-key",
            workdir=workdir,
            max_idle=5,
            memory_sync_deletions=deletions,  # type: ignore[arg-type]
        )
        task = asyncio.create_task(worker.run())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 40
        edited = False
        while loop.time() < deadline and emu.work.item(item.id).state != "stopped":
            if not edited and emu.posted_events(sid):
                emu.resources.put(f"memstore_{sid}", "/c.md", "server-c\n")
                edited = True
            await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()

    asyncio.run(main())
    return _text(emu.posted_events(sid)[0])


@pytest.mark.timeout(60)
def test_handle_item_serves_one_claimed_item(emu: Emulator, root: Path) -> None:
    sid = "sesn_handle"
    (item,) = emu.add_environment(ENV_ID, [scenario(sid)])
    secret = item.to_json(with_secret=True)["secret"]
    env = {
        "ANTHROPIC_WORK_ID": item.id,
        "ANTHROPIC_ENVIRONMENT_ID": ENV_ID,
        "ANTHROPIC_SESSION_ID": sid,
        "ANTHROPIC_WORK_SECRET": secret,
    }
    proc = _serve(emu, root, "--handle-item", "--header", "x-trace-id: t-123", env=env)
    emu.wait_for_posted(sid, 1, 30)
    emu.resources.put(f"memstore_{sid}", "/c.md", "server-c\n")
    try:
        _, logs = proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("serve --handle-item did not exit after its item")
    assert proc.returncode == 0, logs
    assert emu.work.item(item.id).state == "stopped"
    assert not emu.requests(endpoint="work_poll")
    assert "pdf-skill" in _text(emu.posted_events(sid)[0])
    assert emu.resources.store(f"memstore_{sid}").contents() == expected_notes("enabled")
    traced = [r for r in emu.requests() if r.headers.get("x-trace-id") == "t-123"]
    assert {r.endpoint for r in traced} >= {"work_heartbeat", "retrieve", "skill_download", "memory_list"}
    tokens = {r.headers.get("authorization") for r in emu.requests(endpoint="memory_list")}
    assert tokens == {f"Bearer {item.sessions_token}"} or {
        r.headers.get("x-api-key") for r in emu.requests(endpoint="memory_list")
    } == {item.sessions_token}


@pytest.mark.timeout(60)
def test_worker_id_on_each_poll(emu: Emulator, root: Path) -> None:
    sid = "sesn_worker_id"
    (item,) = emu.add_environment(ENV_ID, [scenario(sid)])
    proc = _serve(emu, root, "--environment-id", ENV_ID, "--worker-id", "w-42", "--no-skills")
    try:
        assert emu.work.wait_until(lambda: emu.work.item(item.id).state == "stopped", 30)
    finally:
        _stop(proc)
    polls = emu.requests(endpoint="work_poll")
    assert polls and {r.headers.get("anthropic-worker-id") for r in polls} == {"w-42"}


@pytest.mark.timeout(60)
def test_no_sessions_token_with_stores_fails_clearly_unless_memory_is_off(emu: Emulator, root: Path) -> None:
    for sid, extra in (("sesn_notoken", ()), ("sesn_notoken_off", ("--memory-sync-interval", "off"))):
        (item,) = emu.add_environment(ENV_ID, [scenario(sid)])
        env = {"ANTHROPIC_WORK_ID": item.id, "ANTHROPIC_ENVIRONMENT_ID": ENV_ID, "ANTHROPIC_SESSION_ID": sid}
        proc = _serve(emu, root, "--handle-item", *extra, env=env)
        if extra:
            emu.wait_for_posted(sid, 1, 30)
        try:
            _, logs = proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("serve --handle-item did not exit after its item")
        assert proc.returncode == 0, logs
        results = [e for e in emu.posted_events(sid) if e["type"] == "user.tool_result"]
        if extra:
            assert len(results) == 1 and "pdf-skill" in _text(results[0])
        else:
            assert "no sessions token" in logs and not results


@pytest.mark.timeout(60)
def test_stockade_run_with_the_builtin_toolset(emu: Emulator, root: Path) -> None:
    sid = "sesn_run"
    emu.add_session(scenario(sid))
    environ = {**os.environ, "ANTHROPIC_API_KEY": "sk-run", "ANTHROPIC_BASE_URL": emu.base_url}
    argv = [sys.executable, "-m", "stockade.supervisor", "run", sid, "-v", "--no-journal"]
    argv += ["--tools", "stockade.tools.builtin:agent_toolset", "--memory-sync-deletions", "log_only"]
    proc = subprocess.Popen(
        argv, cwd=root, env=environ, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        posted = emu.wait_for_posted(sid, 1, 30)
        emu.resources.put(f"memstore_{sid}", "/c.md", "server-c\n")
        _, logs = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, logs
    output = _text(posted[0])
    assert "pdf-skill" in output and "ro-refused" in output, output
    assert emu.resources.store(f"memstore_{sid}").contents() == expected_notes("log_only")
    assert emu.resources.store(f"memstore_ro_{sid}").contents() == {"/r.md": "reference\n"}


STARTED_AND_CALLED_S = 40.0
"""How long a `serve` process may take to start and run its first call (a bound, not an expectation)."""


def _wait_for(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(90)
def test_memory_is_pushed_on_idle_and_after_calls_once_due(emu: Emulator, root: Path) -> None:
    sid = "sesn_cadence"
    spec = scenario(sid)
    notes = root / "work_0001.memory" / "notes"
    spec["steps"] = [
        {"running": True},
        {
            "tool_use": "bash",
            "id": "tu_1",
            "input": {"command": f"{_FIND}; echo one > $(m notes)/x.md"},
        },
        {"wait": ["tu_1"], "timeout_s": 30},
        {"idle": "end_turn"},
        {"sleep": 3},
        {"running": True},
        {"sleep": 5.5},  # the sync interval passes
        # The write tool (bash's shell ended with the idle thread); the store folder is one of its roots.
        {"tool_use": "write", "id": "tu_2", "input": {"file_path": str(notes / "y.md"), "content": "two"}},
        {"wait": ["tu_2"], "timeout_s": 30},
        {"sleep": 3},
        {"terminate": True},
    ]
    (item,) = emu.add_environment(ENV_ID, [spec])
    proc = _serve(emu, root, "--environment-id", ENV_ID, "--memory-sync-interval", "5")
    contents = emu.resources.store(f"memstore_{sid}").contents
    try:
        # From the process's start: `serve` imports `anthropic` first (seconds on a loaded machine).
        assert _wait_for(lambda: "/x.md" in contents(), STARTED_AND_CALLED_S)
        assert emu.status(sid) == "idle"  # pushed by the idle flush, not the end
        assert _wait_for(lambda: "/y.md" in contents(), 15), emu.posted_events(sid)
        assert emu.status(sid) != "terminated"  # pushed by the sync after the call
        assert emu.work.wait_until(lambda: emu.work.item(item.id).state == "stopped", 30)
    finally:
        _stop(proc)


@pytest.mark.timeout(60)
def test_drain_mid_call_still_flushes_edits_but_sends_no_deletes(emu: Emulator, root: Path) -> None:
    sid = "sesn_drain"
    spec = scenario(sid)
    command = f"{_FIND}; N=$(m notes); echo drained > $N/a.md; rm $N/b.md; echo started; sleep 30"
    spec["steps"] = [
        {"running": True},
        {"tool_use": "bash", "id": "tu_d", "input": {"command": command}},
        {"wait": ["tu_d"], "timeout_s": 50},
        {"terminate": True},
    ]
    (item,) = emu.add_environment(ENV_ID, [spec])
    proc = _serve(emu, root, "--environment-id", ENV_ID, "--drain-grace", "0.5")
    notes = root / "work_0001.memory" / "notes"
    drained = notes / "a.md"
    assert _wait_for(lambda: drained.exists() and drained.read_text() == "drained\n", STARTED_AND_CALLED_S)
    logs = _stop(proc)
    assert emu.work.item(item.id).state == "stopped", logs
    assert emu.resources.store(f"memstore_{sid}").contents() == {
        "/a.md": "drained\n",
        "/b.md": "beta\n",  # an aborted run sends no deletes
        "/c.md": "gamma\n",
    }
