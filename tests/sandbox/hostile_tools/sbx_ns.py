"""Hostile tools for the namespace tests (PID, IPC, keyring, disk, mount view). Imported only in workers."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import time

from stockade.tools.base import tool

PR_SET_CHILD_SUBREAPER = 36
IPC_CREAT = 0o1000
SHM_BYTES = 1 << 20
KEY_SPEC_SESSION_KEYRING = -3
KEY_SPEC_USER_KEYRING = -4
KEYCTL_SEARCH = 10
_KEY_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}  # add_key, keyctl
CHUNK_BYTES = 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _errno_name(err: int) -> str:
    import errno

    return errno.errorcode.get(err, str(err))


@tool
def orphan(token: str) -> str:
    """Drop the worker's subreaper role, then double-fork a `sleep` (its argv carries `token`) in a
    session of its own, and return while it runs."""
    return _orphan(token)


def _orphan(token: str) -> str:
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", token])
        os._exit(0)
    os.wait()
    time.sleep(0.1)  # the grandchild has exec'd
    return "started"


@tool
def orphan_then_hang(token: str) -> str:
    """`orphan`, then never return (and ignore SIGTERM): only the supervisor's tree kill ends it."""
    import signal

    _orphan(token)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)


@tool
def proc_pids() -> str:
    """The pids /proc lists, space-separated."""
    return " ".join(sorted((name for name in os.listdir("/proc") if name.isdigit()), key=int))


@tool
def make_shm(key: int) -> str:
    """Create a SysV shared memory segment under `key` and leave it; returns its id."""
    shmid = _libc.shmget(ctypes.c_int(key), ctypes.c_size_t(SHM_BYTES), ctypes.c_int(IPC_CREAT | 0o666))
    return str(shmid) if shmid >= 0 else "error " + _errno_name(ctypes.get_errno())


@tool
def find_shm(key: int) -> str:
    """Look up the SysV shared memory segment of `key`: its id, or the errno name."""
    shmid = _libc.shmget(ctypes.c_int(key), ctypes.c_size_t(0), ctypes.c_int(0))
    return str(shmid) if shmid >= 0 else _errno_name(ctypes.get_errno())


def _key_syscalls() -> tuple[int, int]:
    return _KEY_SYSCALLS[platform.machine()]


@tool
def add_keys(description: str) -> str:
    """Add a user key `description` to the session and the user keyring: the results, space-separated."""
    add_key = _key_syscalls()[0]
    payload = b"stolen-secret"
    results = []
    for keyring in (KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING):
        serial = _libc.syscall(
            ctypes.c_long(add_key),
            b"user",
            description.encode(),
            payload,
            ctypes.c_size_t(len(payload)),
            ctypes.c_int(keyring),
        )
        results.append(str(serial) if serial >= 0 else _errno_name(ctypes.get_errno()))
    return " ".join(results)


@tool
def search_keys(description: str) -> str:
    """Search the session and user keyrings for key `description`: serials or errno names."""
    keyctl = _key_syscalls()[1]
    results = []
    for keyring in (KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING):
        serial = _libc.syscall(
            ctypes.c_long(keyctl),
            ctypes.c_int(KEYCTL_SEARCH),
            ctypes.c_int(keyring),
            b"user",
            description.encode(),
            ctypes.c_int(0),
        )
        results.append(str(serial) if serial >= 0 else _errno_name(ctypes.get_errno()))
    return " ".join(results)


@tool
def fill_disk(paths: list[str], mib: int) -> str:
    """Write `mib` MiB to each of `paths` in 1 MiB chunks (an OSError ends the call)."""
    chunk = b"x" * CHUNK_BYTES
    for path in paths:
        with open(path, "wb") as file:
            for _ in range(mib):
                file.write(chunk)
                file.flush()
    return "written"


@tool
def read_secret(path: str) -> str:
    """Try to read `path` in Python and with `cat`: both results, one per line."""
    try:
        with open(path) as file:
            direct = "read: " + file.read()
    except OSError as exc:
        direct = "refused: " + _errno_name(exc.errno or 0)
    shell = subprocess.run(["/bin/cat", path], capture_output=True, text=True, timeout=10, check=False)
    return direct + "\n" + ("cat read: " + shell.stdout if shell.returncode == 0 else "cat refused")


@tool
def write_file(path: str) -> str:
    """Write `path` (in Python) and `path`.sh (with a shell); returns "ok"."""
    with open(path, "w") as file:
        file.write("tool")
    subprocess.run(["/bin/sh", "-c", f"echo shell > '{path}.sh'"], check=True, timeout=10)
    return "ok"


@tool
def burn(seconds: float) -> str:
    """Use `seconds` of CPU."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return "burnt"


@tool
def cgroups() -> str:
    """The cgroup files of the namespace's init (pid 1) and of this worker, separated by a blank line."""
    with open("/proc/1/cgroup") as init, open("/proc/self/cgroup") as me:
        return init.read().strip() + "\n\n" + me.read().strip()


@tool
def loaded(names: list[str]) -> str:
    """Which of the modules `names` this worker has imported, space-separated ("none" for none)."""
    import sys

    return " ".join(name for name in names if name in sys.modules) or "none"


@tool
def unmount(path: str) -> str:
    """Try to unmount `path` (lazily), as a tool would to uncover what a mount hides; "ok" or the errno
    name, then this process's effective capabilities (hex)."""
    result = "ok" if _libc.umount2(path.encode(), MNT_DETACH) == 0 else _errno_name(ctypes.get_errno())
    with open("/proc/self/status") as status:
        caps = next(line.split()[1] for line in status if line.startswith("CapEff:"))
    return f"{result} {caps}"


@tool
def signal_pid(pid: int) -> str:
    """Send SIGUSR1 to `pid` (the supervisor): "ok" or the errno name."""
    import signal

    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as exc:
        return _errno_name(exc.errno or 0)
    return "ok"


@tool
def exit_with(code: int) -> str:
    """End this worker at once with exit status `code`."""
    os._exit(code)


@tool
def workdir() -> str:
    """The folder this tool runs in (its sandbox's workdir, as the host names it)."""
    return os.getcwd()


TOOLS = [
    exit_with,
    workdir,
    signal_pid,
    unmount,
    loaded,
    burn,
    cgroups,
    orphan,
    orphan_then_hang,
    proc_pids,
    make_shm,
    find_shm,
    add_keys,
    search_keys,
    fill_disk,
    read_secret,
    write_file,
]
