"""`syscalls.close_fds_but`: what a forked worker, its namespace's init and the process outside it run to
drop every fd they inherited but their own pipes. Run in a child process, which it empties."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = """\
import json, os, resource
from stockade.sandbox.isolation import syscalls

if {no_close_range}:  # a number no kernel has: ENOSYS, as from a kernel before close_range (5.9)
    syscalls.SYS_CLOSE_RANGE = 100_000
fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(40)]
high = os.dup2(fds[0], 900)
# A worker lowers its fd limit before its PID namespace forks: fds opened earlier sit above it.
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
keep = {0, 1, 2, fds[5], fds[6], fds[20]}  # two adjacent: no empty range may be closed
syscalls.close_fds_but(keep)
print(json.dumps([sorted(int(n) for n in os.listdir("/proc/self/fd")), sorted(keep)]))
"""


@pytest.mark.parametrize("no_close_range", [False, True], ids=["close_range", "one_close_per_fd"])
def test_every_fd_but_the_kept_ones_is_closed(no_close_range: bool) -> None:
    argv = [sys.executable, "-c", CHILD.replace("{no_close_range}", str(no_close_range))]
    result = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    left, keep = json.loads(result.stdout)
    # listdir's own directory fd is the lowest free one, so it shows as one fd beyond those kept.
    extra = set(left) - set(keep)
    assert set(keep) <= set(left), (left, keep)
    assert len(extra) == 1 and 900 not in extra, (left, keep)
