"""The hostile catalogue as an ordinary user: a throwaway account with planted `~/.ssh` and `~/.aws`
secrets runs the supervisor (`unpriv_driver.py`) from a venv of the system Python. One driver run
serves every test of this file (module fixture), so the file stays well under a minute."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from .. import unpriv_harness

harness: Any = unpriv_harness

CANARY = "sk-ant-unpriv-canary-do-not-leak"
pytestmark = pytest.mark.skipif(
    harness.unavailable_reason() is not None, reason=str(harness.unavailable_reason())
)


class _Loopback:
    """A TCP server on the host's 127.0.0.1 that counts connections."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.05)
        self.port = self.server.getsockname()[1]
        self.hits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self.server.accept()[0].close()
                self.hits += 1
            except TimeoutError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.server.close()


@pytest.fixture(scope="module")
def run() -> Iterator[dict[str, Any]]:
    user = harness.UnprivUser.create()
    loopback = _Loopback()
    try:
        setup = {"home": str(user.home), "port": loopback.port}
        results = user.run_driver(setup, CANARY)
        results["loopback_hits"] = loopback.hits
        results["home_after"] = sorted(os.listdir(user.home))
        yield results
    finally:
        loopback.close()
        user.remove()


def _blocked(result: dict[str, Any]) -> bool:
    return result["kind"] == "completed" and result["text"].startswith("blocked")


pytestmark = [pytestmark, pytest.mark.timeout(90)]


def test_runs_unprivileged_with_read_confinement(run: dict[str, Any]) -> None:
    assert run["uid"] != 0
    assert run["report"]["landlock"] == "on" and run["report"]["seccomp"] == "on"


@pytest.mark.parametrize("key", ["read_ssh_py", "list_ssh_py", "read_aws_py", "list_home_py", "via_init"])
def test_planted_secrets_unreadable_from_python(run: dict[str, Any], key: str) -> None:
    assert _blocked(run[key]), run[key]


def test_planted_secrets_unreadable_from_builtin_bash(run: dict[str, Any]) -> None:
    text = run["read_secrets_bash"]["text"]
    # Refused by Landlock ("Permission denied"), or absent from the worker's mount view ("No such
    # file or directory"): each of the two planted files, by either path, is one of these errors.
    refused = [
        line
        for line in text.splitlines()
        if line.startswith("cat: ") and line.endswith(("Permission denied", "No such file or directory"))
    ]
    assert len(refused) == 3, run["read_secrets_bash"]
    assert harness.SSH_SECRET not in text and harness.AWS_SECRET not in text
    assert "id_rsa" not in text.splitlines()  # `ls -a ~/.ssh` listed nothing


def test_home_not_writable(run: dict[str, Any]) -> None:
    assert _blocked(run["write_home"]), run["write_home"]
    assert run["write_home_bash"]["kind"] != "completed" or "denied" in run["write_home_bash"]["text"]
    assert "pwned" not in run["home_after"] and "x" not in run["home_after"]


@pytest.mark.parametrize("key", ["key_hunt_proc", "key_hunt_files"])
def test_api_key_found_in_no_process_or_file(run: dict[str, Any], key: str) -> None:
    assert _blocked(run[key]), run[key]
    assert CANARY not in run[key]["text"]


def test_no_fd_the_zygote_held_reaches_a_tool(run: dict[str, Any]) -> None:
    assert run["inherited_fds"]["text"] == "blocked: no ruleset, namespace or folder fd", run["inherited_fds"]


def test_host_loopback_unreachable(run: dict[str, Any]) -> None:
    assert _blocked(run["loopback"]), run["loopback"]
    assert run["loopback_hits"] == 0


UNREACHABLE = ("EPERM", "ESRCH")
"""How a signal to the supervisor is refused: EPERM (another uid), or ESRCH where the worker runs in a
PID namespace of its own, in which the supervisor's pid names no process."""


@pytest.mark.parametrize(
    ("key", "errnos"),
    [
        ("signal0_supervisor", UNREACHABLE),
        ("ptrace_supervisor", ("EPERM",)),
        ("unshare_user", ("EPERM",)),
        ("clone_newuser", ("EPERM",)),
    ],
)
def test_supervisor_unreachable_and_no_user_namespace(
    run: dict[str, Any], key: str, errnos: tuple[str, ...]
) -> None:
    assert _blocked(run[key]), run[key]
    assert run[key]["text"].removeprefix("blocked: ") in errnos, run[key]


def test_supervisor_cannot_be_killed(run: dict[str, Any]) -> None:
    assert run["sigusr1_supervisor"]["text"] in UNREACHABLE, run["sigusr1_supervisor"]
    assert run["sigusr1_hits"] == 0


def test_daemon_does_not_outlive_its_call(run: dict[str, Any]) -> None:
    assert run["daemon"]["kind"] == "completed"
    assert run["daemon_leftovers"] == []
    assert run["leftovers_after_close"] == []


def test_daemon_of_a_killed_call_dies_with_its_worker(run: dict[str, Any]) -> None:
    assert run["killed_daemon"]["kind"] == "timed_out", run["killed_daemon"]
    assert run["killed_daemon_leftovers"] == []


def test_memory_bomb_is_over_limit(run: dict[str, Any]) -> None:
    assert run["memory_bomb"]["kind"] == "over_limit", run["memory_bomb"]
    assert run["memory_bomb"]["resource"] == "memory"


def test_fork_bomb_is_contained(run: dict[str, Any]) -> None:
    result = run["fork_bomb"]
    if result["kind"] == "over_limit":
        assert result["resource"] == "processes"
    else:
        assert result["kind"] == "completed" and int(result["text"]) < run["fork_bomb_limit"], result
    assert run["after"] == {"kind": "completed", "text": "still fine", "resource": None}
