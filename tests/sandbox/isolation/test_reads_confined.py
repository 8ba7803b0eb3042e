"""Landlock read rules and the built-in deny list, as root: a worker reads only the system, the
interpreter, its workdir and the policy's paths; the secrets of every home stay unreadable even
where a policy allows their home, unless it names the exact path."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from stockade.sandbox import CallRequest, ResourcePolicy, Sandbox
from stockade.sandbox.isolation import landlock, readable

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
