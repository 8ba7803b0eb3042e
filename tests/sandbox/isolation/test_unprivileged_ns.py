"""The mount, PID and IPC namespaces without root: a throwaway user runs a sandbox through a venv
of the system Python, in a user namespace mapping its own uid.

Needs root to create the user (skipped otherwise, or where `useradd` or `/usr/bin/python3.11` is
missing). The attack: a tool reads the user's planted `~/.ssh/id_rsa` (in Python and with `cat`); and
the files it writes in the user's workdir must belong to the user.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ... import paths
from .. import sbx_testkit as kit

USER = "stockade-ns"
SYSTEM_PYTHON = "/usr/bin/python3.11"
VENV = Path("/tmp/stockade-ns-venv")
HERE = Path(__file__).resolve().parent
SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- planted-for-the-test"
RUN_TIMEOUT_S = 50
SETUP_TIMEOUT_S = 120


def _venv() -> Path:
    """A venv of the system Python with msgspec and psutil, and stockade's folders through a `.pth`
    (a symlink per subpackage: the stockade namespace package), all readable by every user."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(VENV)], check=True, timeout=SETUP_TIMEOUT_S)
        pip = [str(VENV / "bin" / "pip"), "install", "-q", "msgspec", "psutil"]
        subprocess.run(pip, check=True, timeout=SETUP_TIMEOUT_S, capture_output=True)
    src = VENV / "src" / "stockade"
    src.mkdir(parents=True, exist_ok=True)
    for name in ("sandbox", "tools", "supervisor", "emulator"):
        link = src / name
        if link.is_symlink() and os.readlink(link) != str(paths.REPO / name):
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(paths.REPO / name)
    site = next((VENV / "lib").glob("python3*/site-packages"))
    (site / "stockade_src.pth").write_text(str(VENV / "src") + "\n")
    os.chmod(VENV, 0o755)
    return python


@pytest.fixture(scope="module")
def user() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a throwaway user")
    if shutil.which("useradd") is None or not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"needs useradd and {SYSTEM_PYTHON}")
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], check=True, timeout=30)
        entry = pwd.getpwnam(USER)
    yield entry


def _plant(entry: pwd.struct_passwd) -> Path:
    ssh = Path(entry.pw_dir, ".ssh")
    ssh.mkdir(mode=0o700, exist_ok=True)
    key = ssh / "id_rsa"
    key.write_text(SECRET)
    for path in (ssh, key):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    key.chmod(0o600)
    return key


def _run_as(entry: pwd.struct_passwd, python: Path, args: dict[str, str]) -> dict[str, object]:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": entry.pw_dir,
        "PYTHONPATH": str(kit.HOSTILE_DIR),
    }
    argv = [
        shutil.which("runuser") or "/usr/sbin/runuser",
        "-u",
        USER,
        "--",
        str(python),
        str(HERE / "ns_unprivileged_child.py"),
        json.dumps(args),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_unprivileged_sandbox_hides_home_secrets_and_keeps_the_users_files(user: pwd.struct_passwd) -> None:
    python = _venv()
    key = _plant(user)
    workdir = Path(tempfile.mkdtemp(prefix="stockade-ns-work-"))
    try:
        os.chown(workdir, user.pw_uid, user.pw_gid)
        out = _run_as(user, python, {"secret": str(key), "workdir": str(workdir)})
        assert out["uid"] == user.pw_uid
        layers = out["layers"]
        assert isinstance(layers, dict)
        assert all(layers[name] for name in ("userns", "pidns", "ipcns", "mountns")), layers
        results = out["results"]
        assert isinstance(results, dict)
        assert SECRET not in results["secret"], "the tool read the user's private key"
        assert results["secret"].startswith("refused") and "cat refused" in results["secret"]
        assert results["write"] == "ok", results
        for name in ("new.txt", "new.txt.sh"):
            stat = (workdir / name).stat()
            assert (stat.st_uid, stat.st_gid) == (user.pw_uid, user.pw_gid), name
        assert results["unmount_home"] == results["unmount_tmp"] == "EPERM 0000000000000000", results
        assert results["signal"] == "ESRCH" and out["signalled"] == 0  # the supervisor is not even visible
        assert results["orphan"] == "started"
        assert results["pids"] == "1 2", results  # nothing else, the orphan of the call before included
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
