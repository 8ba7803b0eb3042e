"""Limits without root (issue 16): a non-root supervisor uses a delegated cgroup where the host
offers one; otherwise `stockade doctor` says exactly why, and memory and processes fall back to
rlimits. Run as a throwaway unprivileged user (created with useradd when the suite runs as root)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from stockade.sandbox.isolation import delegation

USER = "stockade-host-t"
SYSTEM_PYTHON = "/usr/bin/python3.11"
SITE = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
"""This venv's packages (world-readable; its own interpreter, under /root, is not): the system
Python of the same version loads them as a site directory."""
BOOT = f"import site, sys; site.addsitedir({str(SITE)!r}); "
DOCTOR = (
    BOOT + "from stockade.supervisor.cli import main; sys.argv = ['stockade', 'doctor']; sys.exit(main())"
)


@pytest.fixture(scope="module")
def user() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0 or shutil.which("useradd") is None or not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"needs root, useradd and {SYSTEM_PYTHON} to run as an unprivileged user")
    created = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "-M", "-d", "/nonexistent", "-s", "/bin/false", USER], check=True, timeout=30
        )
        created = True
    try:
        yield pwd.getpwnam(USER)
    finally:
        if created:
            subprocess.run(["userdel", USER], check=False, timeout=30)


def _as(user: pwd.struct_passwd, *argv: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    done = subprocess.run(
        argv,
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        env=env,
        cwd="/tmp",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _host_says(uid: int) -> list[str]:
    """What the reason must name on this host: the cgroup layout's obstacle, the user manager."""
    mountinfo = Path("/proc/self/mountinfo").read_text()
    parts = []
    if delegation._v1_limits(mountinfo):
        parts.append("cgroup v1 (hybrid layout), which cannot be delegated to a user")
    if delegation.user_manager(uid, {}) is None:
        parts.append(f"no systemd user manager runs for uid {uid} (no /run/user/{uid}/systemd/private)")
    else:
        parts.append(delegation.SCOPE_HINT)
    return [*parts, delegation.FALLBACK]


@pytest.mark.timeout(90)
def test_doctor_says_why_a_non_root_user_has_no_cgroup(user: pwd.struct_passwd) -> None:
    out = _as(user, SYSTEM_PYTHON, "-c", DOCTOR)
    line = next(line for line in out.splitlines() if line.startswith("cgroup"))
    assert "unavailable" in line, line
    for words in _host_says(user.pw_uid):
        assert words in line, f"{words!r} not in {line!r}"
    assert "Permission denied" not in line


@pytest.mark.timeout(90)
def test_a_root_owned_cgroup_is_named_as_the_obstacle(user: pwd.struct_passwd) -> None:
    """Where the host's cgroup v2 directory is not the user's, the reason says whose it is."""
    code = BOOT + "from stockade.sandbox.isolation import delegation as d; "
    code += "print(d._subtree_problem('/sys/fs/cgroup', %d))"
    if not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        code = code.replace("/sys/fs/cgroup'", "/sys/fs/cgroup/unified'")
    out = _as(user, SYSTEM_PYTHON, "-c", code % user.pw_uid)
    assert f"belongs to uid 0, not to you (uid {user.pw_uid}): nothing is delegated" in out, out


@pytest.mark.timeout(90)
def test_doctor_says_a_non_root_users_shared_workdir_is_uncapped(user: pwd.struct_passwd) -> None:
    """Only root can mount the `disk` cap on the shared temporary workdir; doctor says so plainly."""
    out = _as(user, SYSTEM_PYTHON, "-c", DOCTOR)
    line = next(line for line in out.splitlines() if line.startswith("shared_workdir_disk"))
    assert "unavailable: needs root: the shared temporary workdir is on the host's disk" in line, line
