"""Landlock read rules and the built-in deny list, as root: a worker reads only the system, the
interpreter, its workdir and the policy's paths; the secrets of every home stay unreadable even
where a policy allows their home, unless it names the exact path."""

from __future__ import annotations

import errno
import json
import os
import resource
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from stockade.sandbox import CallRequest, ResourcePolicy, Sandbox
from stockade.sandbox.isolation import landlock, namespaces, readable, syscalls
from stockade.sandbox.isolation import planner as planner_module
from stockade.sandbox.isolation.planner import Planner
from stockade.sandbox.wire.protocol import PreparedRules

from .. import sbx_testkit as kit
from .. import unpriv_harness

sandbox_environment = kit.sandbox_environment
harness: Any = unpriv_harness

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants secrets in a throwaway user's home (root)")


@pytest.fixture(scope="module")
def user() -> Iterator[Any]:
    """A throwaway user whose planted secrets are world-readable: only Landlock stands in the way."""
    if harness.unavailable_reason() is not None:
        pytest.skip(harness.unavailable_reason())
    created = harness.UnprivUser.create(venv=False)
    for path in (created.home, created.home / ".ssh", created.home / ".aws"):
        path.chmod(0o755)
    for rel in (".ssh/id_rsa", ".aws/credentials"):
        (created.home / rel).chmod(0o644)
    (created.home / "notes.txt").write_text("not a secret\n")
    (created.home / "notes.txt").chmod(0o644)
    (created.home / "project").mkdir(mode=0o777)
    (created.home / "project").chmod(0o777)
    # The user's own, as in a real home: an idmapped writable home lets the slot uid write only
    # what its owner owns (the kernel refuses writes to inodes whose owner the idmap does not map).
    os.chown(created.home / "project", created.uid, created.gid)
    try:
        yield created
    finally:
        created.remove()


def attempts(batch: list[tuple[str, str]], policy: ResourcePolicy = kit.POLICY) -> list[str]:
    results: list[str] = []

    async def scenario(sandbox: Sandbox) -> None:
        request = CallRequest(
            call_id="c-reads", name="attempts", ref="sbx_escape:attempts", input={"batch": json.dumps(batch)}
        )
        outcome = await sandbox.run(request)
        assert outcome.kind == "completed", outcome
        results.extend(json.loads(outcome.content()[0]["text"]))

    kit.in_sandbox(scenario, default=policy)
    return results


def test_allowed_home_keeps_its_secrets_denied(user: Any) -> None:
    home = str(user.home)
    policy = msgspec.structs.replace(kit.POLICY, read_only_paths=(home,))
    ssh, aws, ls_ssh, notes = attempts(
        [
            ("read_file", f"{home}/.ssh/id_rsa"),
            ("read_file", f"{home}/.aws/credentials"),
            ("list_dir", f"{home}/.ssh"),
            ("read_file", f"{home}/notes.txt"),
        ],
        policy,
    )
    assert (ssh, aws, ls_ssh) == ("blocked: EACCES",) * 3
    assert notes.startswith("ESCAPED: read")  # the rest of the allowed home is readable


def test_writable_home_keeps_its_secrets_unwritable(user: Any) -> None:
    home = str(user.home)
    policy = msgspec.structs.replace(kit.POLICY, writable_paths=(home,))
    plant_key, project = attempts(
        [("write_file", f"{home}/.ssh/authorized_keys"), ("write_file", f"{home}/project/ok.txt")], policy
    )
    assert plant_key.startswith("blocked")
    assert project.startswith("ESCAPED: wrote")  # allowed write: the rest of the home is writable
    assert not (user.home / ".ssh" / "authorized_keys").exists()


def test_hard_link_of_a_secret_into_a_writable_folder_is_refused(user: Any) -> None:
    home = str(user.home)
    policy = msgspec.structs.replace(kit.POLICY, writable_paths=(f"{home}/project",))
    (result,) = attempts([("link_read", f"{home}/.ssh/id_rsa:{home}/project/stolen")], policy)
    assert result.startswith("blocked"), result


def test_a_secret_created_after_the_worker_started_stays_denied(user: Any) -> None:
    home = str(user.home)
    policy = msgspec.structs.replace(kit.POLICY, read_only_paths=(home,), pool_size=1)

    async def scenario(sandbox: Sandbox) -> None:
        warm = CallRequest(call_id="w", name="echo", ref=kit.REF, input={"text": "x"})
        assert (await sandbox.run(warm)).kind == "completed"  # the worker's rules are set now
        (user.home / ".netrc").write_text("machine x password hunter2\n")
        (user.home / ".netrc").chmod(0o644)
        batch = json.dumps([("read_file", f"{home}/.netrc")])
        request = CallRequest(call_id="r", name="attempts", ref="sbx_escape:attempts", input={"batch": batch})
        outcome = await sandbox.run(request)
        assert json.loads(outcome.content()[0]["text"]) == ["blocked: EACCES"]

    kit.in_sandbox(scenario, default=policy)


def test_naming_the_exact_path_reopens_it(user: Any) -> None:
    home = str(user.home)
    policy = msgspec.structs.replace(kit.POLICY, read_only_paths=(f"{home}/.ssh",))
    ssh, aws = attempts(
        [("read_file", f"{home}/.ssh/id_rsa"), ("read_file", f"{home}/.aws/credentials")], policy
    )
    assert ssh.startswith("ESCAPED: read") and aws.startswith("blocked")


def test_reads_outside_the_allowed_roots_refused_even_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the mount namespace and the uid drop (a host that lacks them), root's worker still
    cannot read /etc/shadow or a host folder nobody allowed."""
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "mountns,uid")
    with tempfile.TemporaryDirectory(dir="/var/lib") as folder:
        Path(folder, "private.txt").write_text("host data\n")
        shadow, private, usr = attempts(
            [("read_file", "/etc/shadow"), ("read_file", f"{folder}/private.txt"), ("list_dir", "/usr")]
        )
    assert shadow == "blocked: EACCES" and private == "blocked: EACCES"
    assert usr.startswith("ESCAPED")  # the system stays readable


def test_plan_replaces_a_folder_holding_a_secret_by_its_other_children(tmp_path: Path) -> None:
    for rel in ("a/secret/key", "a/other/file", "b/file"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    root = str(tmp_path)
    rules = readable.plan({root: 1}, [], {f"{root}/a/secret"})
    assert sorted(rules) == [f"{root}/a/other", f"{root}/b"]
    # Named by the policy: no longer denied, so the folder holding it is one rule again.
    assert readable.plan({root: 1}, [f"{root}/a/secret"], {f"{root}/a/secret"}) == {root: 1}


def test_no_default_rule_covers_a_home_secret() -> None:
    rules = landlock.rules(["/var/tmp"])
    denied = readable.denied_paths()
    for path in rules:
        assert not any(d == path or d.startswith(path.rstrip("/") + "/") for d in denied), path


def _confined_child(
    prepared: PreparedRules, writable: tuple[str, ...], gained: str, probes: list[str]
) -> list[str]:
    """Fork; the child puts `gained` on its import path, applies Landlock from the zygote-style
    `prepared` rules for `writable`, and tries each probe ("read:<path>" or "write:<path>")."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        results = []
        try:
            os.close(read_end)
            sys.path.append(gained)
            namespaces.forbid_new_privileges()
            landlock.apply_landlock(writable, deny_tcp=False, prepared=prepared)
            for probe in probes:
                kind, path = probe.split(":", 1)
                try:
                    if kind == "read":
                        Path(path).read_bytes()
                    else:
                        Path(path).write_text("x")
                    results.append("ok")
                except OSError as exc:
                    results.append(errno.errorcode[exc.errno or 0])
        finally:
            os.write(write_end, json.dumps(results).encode())
            os._exit(0)
    os.close(write_end)
    landlock.release(prepared)  # The child has its own copy: the zygote closes its one after the fork.
    with os.fdopen(read_end, "rb") as pipe:
        out: list[str] = json.loads(pipe.read() or b"[]")
    os.waitpid(pid, 0)
    return out


def test_rules_planned_before_the_fork_keep_the_secrets_of_an_import_folder_the_worker_gained(
    user: Any, tmp_path: Path
) -> None:
    """A worker forked by the zygote adds rules for the folders it put on `sys.path` since the fork
    (here a home, as a PYTHONPATH naming it would): the zygote's deny list still holds beneath them."""
    home = str(user.home)
    prepared = Planner().prepare((str(tmp_path),), deny_tcp=False)
    got = _confined_child(
        prepared,
        (str(tmp_path),),
        home,
        [
            f"read:{home}/.ssh/id_rsa",
            f"read:{home}/.aws/credentials",
            f"read:{home}/notes.txt",
            f"write:{tmp_path}/f",
        ],
    )
    assert got == ["EACCES", "EACCES", "ok", "ok"]


def test_rules_planned_for_other_paths_are_not_used(tmp_path: Path) -> None:
    """Rules the zygote planned for another policy's paths are discarded: the worker plans its own."""
    planned_for, own = tmp_path / "a", tmp_path / "b"
    planned_for.mkdir()
    own.mkdir()
    prepared = Planner().prepare((str(planned_for),), deny_tcp=False)
    got = _confined_child(prepared, (str(own),), str(own), [f"write:{planned_for}/f", f"write:{own}/f"])
    assert got == ["EACCES", "ok"]


def test_a_plan_serves_later_forks_only_for_a_moment(user: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zygote reuses a plan for forks within `REUSE_S` of its making; after that it plans anew,
    seeing what changed (here a folder next to a denied path, which gains a rule of its own)."""
    home, folder = str(user.home), user.home / ".docker"
    planner = Planner()

    def count() -> int:
        prepared = planner.prepare((), deny_tcp=False, readable_paths=(home,))
        landlock.release(prepared)
        return prepared.rules

    before = count()
    folder.mkdir()
    try:
        (folder / "other").write_text("x")
        assert count() == before  # reused: a worker forked now is as old as a warm one of 1 s
        monkeypatch.setattr(planner_module, "REUSE_S", 0.0)
        assert count() == before + 1
    finally:
        (folder / "other").unlink()
        folder.rmdir()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_plan_holds_its_folders_open_only_while_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The zygote keeps a plan's folders open for the forks it serves (one syscall per rule each), and
    closes them once the plan is stale: a zygote serving many policies must not run out of fds."""
    planner = Planner()
    before = _open_fds()
    for _ in range(3):
        landlock.release(planner.prepare((), deny_tcp=False))
    held = _open_fds() - before
    assert held > 10  # the plan's folders, opened once for the three forks
    monkeypatch.setattr(planner_module, "REUSE_S", 0.0)
    landlock.release(planner.prepare((), deny_tcp=False))  # the stale plan is replaced
    assert _open_fds() - before == held


def test_folders_that_cannot_all_be_opened_are_refused_not_narrowed() -> None:
    """Out of fds is not a missing path: a plan built without some of its folders would deny workers
    what their rules grant, so the zygote refuses it (the worker then plans on its own)."""
    planned = landlock.rules(())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (_open_fds() + len(planned) // 2, hard))
    try:
        with pytest.raises(OSError) as raised:
            landlock.Folders(planned, syscalls.landlock_abi())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert raised.value.errno == errno.EMFILE
