"""Run the sandbox as a throwaway unprivileged user (tests run as root on these machines).

`UnprivUser.create()` adds a user with a home under /home, plants `~/.ssh/id_rsa` and
`~/.aws/credentials` (mode 0600, owned by the user: readable by the user, as on a laptop), and builds
a venv the user can run: `/usr/bin/python3.11 -m venv`, with a `.pth` line adding this worktree's
venv site-packages (world-readable, same CPython 3.11 ABI), so stockade, msgspec and psutil import.
`run_driver()` runs `unpriv_driver.py` as that user with the API key in its environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import site
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).parent
SYSTEM_PYTHON = "/usr/bin/python3.11"
SSH_SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- stockade-planted-ssh-secret"
AWS_SECRET = "aws_secret_access_key = stockade-planted-aws-secret"
DRIVER_TIMEOUT_S = 50.0


def unavailable_reason() -> str | None:
    """Why the unprivileged run is impossible here, or None."""
    if os.geteuid() != 0:
        return "needs root to create a throwaway user (the suite already runs unprivileged)"
    for tool in ("useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} not found"
    if not _world_reachable(_site_packages()):
        return f"{_site_packages()} is not readable by other users"
    return None


def _site_packages() -> str:
    return next(p for p in site.getsitepackages() if p.endswith("site-packages"))


def _world_reachable(path: str) -> bool:
    current = Path(path).resolve()
    return all(part.stat().st_mode & 0o005 for part in [current, *current.parents])


class UnprivUser:
    """A throwaway user with planted secrets and a venv it can run."""

    def __init__(self, name: str, home: Path, venv: Path) -> None:
        self.name, self.home, self.venv = name, home, venv
        entry = pwd.getpwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid

    @classmethod
    def create(cls, *, venv: bool = True) -> UnprivUser:
        name = f"stk-filt-{uuid.uuid4().hex[:6]}"
        home = Path("/home") / name
        subprocess.run(["useradd", "-m", "-d", str(home), "-s", "/bin/bash", name], check=True, timeout=30)
        user = cls(name, home, Path(tempfile.mkdtemp(prefix="stockade-unpriv-venv-")))
        user._plant()
        if venv:
            user._make_venv()
        return user

    def _plant(self) -> None:
        for rel, text in ((".ssh/id_rsa", SSH_SECRET), (".aws/credentials", AWS_SECRET)):
            path = self.home / rel
            path.parent.mkdir(mode=0o700, exist_ok=True)
            path.write_text(text + "\n")
            path.chmod(0o600)
            for p in (path, path.parent):
                os.chown(p, self.uid, self.gid)

    def _make_venv(self) -> None:
        self.venv.chmod(0o755)
        subprocess.run(
            [SYSTEM_PYTHON, "-m", "venv", "--without-pip", "--clear", str(self.venv)], check=True, timeout=60
        )
        purelib = (
            self.venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        )
        (purelib / "stockade-dev.pth").write_text(f"import site; site.addsitedir({_site_packages()!r})\n")
        subprocess.run(["chmod", "-R", "a+rX", str(self.venv)], check=True, timeout=30)

    def run_driver(self, setup: dict[str, Any], api_key: str) -> dict[str, Any]:
        """Run `unpriv_driver.py` as this user; its JSON result."""
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "ANTHROPIC_API_KEY": api_key,
            "PYTHONPATH": os.pathsep.join([str(HERE / "hostile_tools"), str(HERE)]),
        }
        proc = subprocess.run(
            [str(self.venv / "bin" / "python"), str(HERE / "unpriv_driver.py"), json.dumps(setup)],
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            env=env,
            cwd=str(self.home),
            capture_output=True,
            text=True,
            timeout=DRIVER_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0 or not proc.stdout.strip():
            raise AssertionError(f"driver failed ({proc.returncode}): {proc.stderr[-4000:]}")
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result

    def remove(self) -> None:
        """Kill what the user still runs, delete the user, its home and the venv."""
        for proc in psutil.process_iter(["uids"]):  # only this throwaway user's own processes
            if proc.info["uids"] and proc.info["uids"].real == self.uid:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        subprocess.run(["userdel", "-r", "-f", self.name], check=False, timeout=30, capture_output=True)
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.rmtree(self.venv, ignore_errors=True)
