"""Test harness: run `isolation_child.py` as a caged stand-in worker, and small host canaries."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
from stockade.sandbox.isolation.cage import Cage
from stockade.sandbox.policy import ResourcePolicy

CHILD = Path(__file__).with_name("isolation_child.py")
RESULT_TIMEOUT_S = 20.0
REAP_TIMEOUT_S = 5.0


class Worker:
    """One caged child: started, attached to its cage, then released with "go"."""

    def __init__(self, action: str, policy: ResourcePolicy, workdir: Path, **args: Any) -> None:
        self.cage = Cage.create(policy, f"test-{uuid.uuid4().hex[:8]}")
        payload = {"action": action, "policy": msgspec.to_builtins(policy), "workdir": str(workdir), **args}
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(payload)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, **self.cage.preexec_env()},
            start_new_session=True,
        )
        self.cage.attach(self.proc.pid)
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def result(self, timeout_s: float = RESULT_TIMEOUT_S) -> dict[str, Any]:
        """The child's JSON line, or {} if it died or went silent first."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        return json.loads(line) if line.strip() else {}

    def finish(self) -> None:
        self.cage.kill_tree(self.proc.pid, 0.1)
        self.proc.wait(REAP_TIMEOUT_S)
        self.cage.close()


def run_child(action: str, policy: ResourcePolicy, workdir: Path, **args: Any) -> dict[str, Any]:
    worker = Worker(action, policy, workdir, **args)
    try:
        return worker.result()
    finally:
        worker.finish()


@contextmanager
def host_dir(parent: str) -> Iterator[Path]:
    """A 0755 directory under `parent` (reachable by slot uids), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="stockade-iso-", dir=parent))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Canary:
    """Loopback TCP and UDP listeners that count what reaches them."""

    def __init__(self) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.tcp_port = self.tcp.getsockname()[1]
        self.udp_port = self.udp.getsockname()[1]
        self.hits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.tcp, self.udp], [], [], 0.05)
            for sock in ready:
                if sock is self.tcp:
                    conn, _ = self.tcp.accept()
                    conn.close()
                else:
                    sock.recv(64)
                self.hits += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.tcp.close()
        self.udp.close()
