"""Escape attempts, one per name: each returns "blocked: <why>" or "ESCAPED: <what it got>".

Imported only inside sandbox workers (root suite and the unprivileged-user harness alike).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from stockade.tools.base import tool

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long
_X86 = os.uname().machine == "x86_64"
# name: (x86_64, aarch64) syscall numbers.
_NR = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "unshare": (272, 97),
    "setns": (308, 268),
    "kexec_load": (246, 104),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "clone": (56, 220),
    "clone3": (435, 435),
    "fsopen": (430, 430),
    "open_tree": (428, 428),
    "pidfd_getfd": (438, 438),
}
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000


def _sys(name: str, *args: object) -> tuple[int, int]:
    """(result, errno) of a raw syscall."""
    nr = _NR[name][0 if _X86 else 1]
    result = int(_LIBC.syscall(ctypes.c_long(nr), *args))
    return result, ctypes.get_errno() if result < 0 else 0


def _errname(err: int) -> str:
    return errno.errorcode.get(err, str(err))


def _expect_refused(name: str, *args: object, want: int = errno.EPERM) -> str:
    result, err = _sys(name, *args)
    if result >= 0:
        with contextlib.suppress(OSError):
            if name in ("bpf", "userfaultfd", "io_uring_setup", "perf_event_open", "fsopen", "open_tree"):
                os.close(result)
        return f"ESCAPED: {name} returned {result}"
    return (
        f"blocked: {_errname(err)}"
        if err == want
        else f"ESCAPED: {name} reached the kernel ({_errname(err)})"
    )


def _child_sleeper() -> int:
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    return pid


def _reap(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def ptrace_child(_: str) -> str:
    """PTRACE_ATTACH to our own child (allowed by every LSM default)."""
    pid = _child_sleeper()
    try:
        return _expect_refused("ptrace", ctypes.c_long(16), ctypes.c_long(pid), None, None)
    finally:
        _reap(pid)


def ptrace_target(target: str) -> str:
    """PTRACE_ATTACH to another process (the supervisor, the zygote)."""
    result, err = _sys("ptrace", ctypes.c_long(16), ctypes.c_long(int(target)), None, None)
    return f"ESCAPED: attached to {target}" if result == 0 else f"blocked: {_errname(err)}"


def process_vm_readv(_: str) -> str:
    """Read our own memory through process_vm_readv (the same call reads a sibling's)."""
    buf = ctypes.create_string_buffer(8)
    local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
    remote = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
    return _expect_refused("process_vm_readv", os.getpid(), local, 1, remote, 1, 0)


def _plain(name: str, *args: object) -> Callable[[str], str]:
    return lambda _: _expect_refused(name, *args)


def unshare_user(_: str) -> str:
    """A user namespace: the way to every capability inside it."""
    return _expect_refused("unshare", ctypes.c_int(CLONE_NEWUSER))


def clone_newuser(_: str) -> str:
    """clone(CLONE_NEWUSER | SIGCHLD): a child in a new user namespace."""
    result, err = _sys("clone", ctypes.c_ulong(CLONE_NEWUSER | signal.SIGCHLD), None, None, None, None)
    if result == 0:
        os._exit(0)
    if result > 0:
        os.waitpid(result, 0)
        return "ESCAPED: child in a new user namespace"
    return (
        f"blocked: {_errname(err)}"
        if err == errno.EPERM
        else f"ESCAPED: reached the kernel ({_errname(err)})"
    )


def clone3(_: str) -> str:
    """clone3 must say ENOSYS, so libc falls back to the checkable clone."""
    return _expect_refused("clone3", None, ctypes.c_size_t(0), want=errno.ENOSYS)


def _socket(family: int, kind: int) -> Callable[[str], str]:
    def attempt(_: str) -> str:
        try:
            socket.socket(family, kind).close()
        except OSError as exc:
            return f"blocked: {_errname(exc.errno or 0)}" if exc.errno == errno.EPERM else f"ESCAPED: {exc}"
        return f"ESCAPED: socket({family}, {kind}) created"

    return attempt


def still_works(_: str) -> str:
    """What tools do need: threads, subprocesses, inet/unix/netlink sockets, name lookup."""
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(1))
    thread.start()
    thread.join(5)
    out = subprocess.run(
        ["/bin/sh", "-c", "echo $((6*7))"], capture_output=True, text=True, timeout=10, check=True
    )
    for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_DGRAM)):
        socket.socket(family, kind).close()
    socket.socketpair()[0].close()
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
    socket.getaddrinfo("localhost", 80)
    return f"ok {done} {out.stdout.strip()}"


def _canary_in(data: bytes, canary: str) -> bool:
    return canary.encode() in data


def key_hunt_proc(canary: str) -> str:
    """Every other process's environ, cmdline and readable memory, as far as /proc gives them (our
    own memory holds the canary: it is this call's input)."""
    found = []
    for entry in glob.glob("/proc/[0-9]*"):
        if entry == f"/proc/{os.getpid()}":
            continue
        for name in ("environ", "cmdline"):
            with contextlib.suppress(OSError), open(f"{entry}/{name}", "rb") as handle:
                if _canary_in(handle.read(), canary):
                    found.append(f"{entry}/{name}")
        found += _hunt_mem(entry, canary)
    return f"ESCAPED: {found}" if found else "blocked: not found"


def _hunt_mem(entry: str, canary: str) -> list[str]:
    try:
        maps = open(f"{entry}/maps").read().splitlines()  # noqa: SIM115
        mem = os.open(f"{entry}/mem", os.O_RDONLY)
    except OSError:
        return []
    try:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if perms.startswith("r") and end - start <= 64 << 20:
                with contextlib.suppress(OSError, OverflowError):
                    if _canary_in(os.pread(mem, end - start, start), canary):
                        return [f"{entry}/mem"]
    finally:
        os.close(mem)
    return []


def key_hunt_files(canary: str) -> str:
    """Files where a key might rest: the supervisor's cwd, homes, /tmp, /run, /etc, and /proc/*/cwd."""
    roots = ["/root", "/home", "/tmp", "/var/tmp", "/run", "/etc", *glob.glob("/proc/[0-9]*/cwd")]
    found: list[str] = []
    budget = [3000]
    for root in roots:
        for folder, _dirs, files in os.walk(root):
            for name in files:
                budget[0] -= 1
                if budget[0] < 0:
                    return f"ESCAPED: {found}" if found else "blocked: not found (budget)"
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError), open(path, "rb") as handle:
                    if _canary_in(handle.read(1 << 20), canary):
                        found.append(path)
    return f"ESCAPED: {found}" if found else "blocked: not found"


def via_init(path: str) -> str:
    """Reach outside the worker's mount namespace through its PID namespace's init (pid 1), which
    was forked before the worker's mounts: `path` below the init's root, its root and cwd
    themselves, its environment, memory and every fd it holds."""
    targets = [f"/proc/1/root{path}", "/proc/1/root/.", "/proc/1/cwd/.", "/proc/1/environ", "/proc/1/mem"]
    with contextlib.suppress(OSError):
        targets += [f"/proc/1/fd/{fd}" for fd in os.listdir("/proc/1/fd")]
    opened, errnos = [], set()
    for target in targets:
        try:
            os.close(os.open(target, os.O_RDONLY | os.O_NONBLOCK))
        except OSError as exc:
            errnos.add(_errname(exc.errno or 0))
        else:
            opened.append(target)
    return f"ESCAPED: opened {opened}" if opened else "blocked: " + ",".join(sorted(errnos))


def signal_target(target: str) -> str:
    """Signal 0 (the permission check of every signal) to a pid outside the worker."""
    try:
        os.kill(int(target), 0)
    except OSError as exc:
        return f"blocked: {_errname(exc.errno or 0)}"
    return f"ESCAPED: may signal {target}"


def write_file(path: str) -> str:
    """Create or append to `path` (planting code in site-packages, a .pth, a .pyc, the tool folder)."""
    try:
        with open(path, "ab") as handle:
            handle.write(b"import os  # planted\n")
    except OSError as exc:
        return f"blocked: {_errname(exc.errno or 0)}"
    return f"ESCAPED: wrote {path}"


def write_existing(path: str) -> str:
    """Write a kernel knob's own value back (/proc/sys, /sys, cgroup files): harmless if it lands,
    and proof of write access; `cgroup.procs` gets our pid (leaving the cage's cgroup)."""
    try:
        value = f"{os.getpid()}\n".encode() if path.endswith("cgroup.procs") else open(path, "rb").read()  # noqa: SIM115
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        return f"blocked: {_errname(exc.errno or 0)}"
    try:
        os.write(fd, value)
    except OSError as exc:
        return f"blocked: opened, write refused ({_errname(exc.errno or 0)})"
    finally:
        os.close(fd)
    return f"ESCAPED: wrote {path}"


def own_cgroup_files(_: str) -> str:
    """Every cgroup file that caps us (memory.max, pids.max, ...) and every controller root's
    cgroup.procs: a write to any of them lifts the cage's limits."""
    targets = glob.glob("/sys/fs/cgroup/cgroup.procs") + glob.glob("/sys/fs/cgroup/*/cgroup.procs")
    with contextlib.suppress(OSError):
        for line in open("/proc/self/cgroup").read().splitlines():  # noqa: SIM115
            _, controllers, rel = line.split(":", 2)
            base = "/sys/fs/cgroup" + (f"/{controllers.replace('name=', '')}" if controllers else "")
            for name in ("memory.max", "memory.limit_in_bytes", "pids.max", "cpu.max"):
                targets += glob.glob(f"{base}{rel}/{name}") + glob.glob(f"/sys/fs/cgroup/unified{rel}/{name}")
    escaped = [t for t in sorted(set(targets)) if write_existing(t).startswith("ESCAPED")]
    return f"ESCAPED: {escaped}" if escaped else f"blocked: {len(set(targets))} files refused"


def read_file(path: str) -> str:
    """Read a secret file."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return f"blocked: {_errname(exc.errno or 0)}"
    return f"ESCAPED: read {len(data)} bytes" if data else "blocked: reads as empty"


def link_read(paths: str) -> str:
    """Hard-link a secret ("SECRET:DEST") into a readable folder, then read it there."""
    secret, dest = paths.split(":")
    try:
        os.link(secret, dest)
    except OSError as exc:
        return f"blocked: {_errname(exc.errno or 0)}"
    return read_file(dest)


def list_dir(path: str) -> str:
    """List a directory of secrets."""
    try:
        names = os.listdir(path)
    except OSError as exc:
        return f"blocked: {_errname(exc.errno or 0)}"
    return f"ESCAPED: {names}" if names else "blocked: empty"


def setuid_binary(path: str) -> str:
    """Start a setuid-root binary and look at its effective uid while it waits on stdin."""
    try:
        proc = subprocess.Popen(
            [path], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    except OSError as exc:
        return f"blocked: {_errname(exc.errno or 0)}"
    try:
        time.sleep(0.3)
        status = open(f"/proc/{proc.pid}/status").read()  # noqa: SIM115
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    except (OSError, StopIteration):
        uids = []
    finally:
        proc.kill()
        proc.wait(5)
    if uids and uids[1] == "0" and os.geteuid() != 0:
        return f"ESCAPED: euid 0 ({uids})"
    return f"blocked: uids {uids}"


def raw_connect(port: str) -> str:
    """TCP connect and UDP send to a loopback port (the host's, where the network is shared)."""
    results = []
    try:
        socket.create_connection(("127.0.0.1", int(port)), 1.0).close()
        results.append("tcp connected")
    except OSError as exc:
        results.append(f"tcp {_errname(exc.errno or 0)}")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(b"x", ("127.0.0.1", int(port)))
        results.append("udp sent")
    except OSError as exc:
        results.append(f"udp {_errname(exc.errno or 0)}")
    return f"ESCAPED: {results}" if "tcp connected" in results else f"blocked: {results}"


def inherited_fds(_: str) -> str:
    """Look through our open fds for what the zygote held while forking us: a Landlock ruleset (to
    which rules could be added), a user namespace made for an idmap, or a folder opened for a rule."""
    found = []
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in os.listdir(listing):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{name}")
                folder = int(name) != listing and target.startswith("/") and os.path.isdir(target)
                if "landlock" in target or target.startswith("user:[") or folder:
                    found.append(f"{name} -> {target}")
    finally:
        os.close(listing)
    return f"ESCAPED: {', '.join(found)}" if found else "blocked: no ruleset, namespace or folder fd"


ATTACKS: dict[str, Callable[[str], str]] = {
    "ptrace_child": ptrace_child,
    "ptrace_target": ptrace_target,
    "process_vm_readv": process_vm_readv,
    "bpf": _plain("bpf", ctypes.c_int(0), None, ctypes.c_uint(0)),
    "perf_event_open": _plain("perf_event_open", None, 0, -1, -1, ctypes.c_ulong(0)),
    "userfaultfd": _plain("userfaultfd", ctypes.c_int(0)),
    "io_uring_setup": _plain("io_uring_setup", ctypes.c_uint(1), None),
    "keyctl": _plain("keyctl", ctypes.c_int(0), ctypes.c_int(-3), ctypes.c_int(0)),
    "add_key": _plain("add_key", b"user", b"stockade", b"secret", ctypes.c_size_t(6), ctypes.c_int(-2)),
    "request_key": _plain("request_key", b"user", b"stockade", None, ctypes.c_int(0)),
    "mount": _plain("mount", b"none", b"/tmp", b"tmpfs", ctypes.c_ulong(0), None),
    "umount2": _plain("umount2", b"/proc", ctypes.c_int(2)),
    "pivot_root": _plain("pivot_root", b"/tmp", b"/tmp"),
    "unshare_user": unshare_user,
    "unshare_mount": _plain("unshare", ctypes.c_int(CLONE_NEWNS)),
    "setns": _plain("setns", ctypes.c_int(-1), ctypes.c_int(0)),
    "clone_newuser": clone_newuser,
    "clone3": clone3,
    "fsopen": _plain("fsopen", b"tmpfs", ctypes.c_uint(0)),
    "open_tree": _plain("open_tree", ctypes.c_int(-100), b"/", ctypes.c_uint(1)),
    "pidfd_getfd": _plain("pidfd_getfd", ctypes.c_int(-1), ctypes.c_int(0), ctypes.c_uint(0)),
    "kexec_load": _plain("kexec_load", ctypes.c_ulong(0), ctypes.c_ulong(0), None, ctypes.c_ulong(0)),
    "init_module": _plain("init_module", None, ctypes.c_ulong(0), b""),
    "finit_module": _plain("finit_module", ctypes.c_int(-1), b"", ctypes.c_int(0)),
    "delete_module": _plain("delete_module", b"stockade", ctypes.c_uint(0)),
    "socket_vsock": _socket(40, socket.SOCK_STREAM),
    "socket_alg": _socket(38, socket.SOCK_SEQPACKET),
    "socket_packet": _socket(17, socket.SOCK_RAW),
    "socket_raw_inet": _socket(socket.AF_INET, socket.SOCK_RAW),
    "socket_key": _socket(15, socket.SOCK_RAW),
    "still_works": still_works,
    "key_hunt_proc": key_hunt_proc,
    "key_hunt_files": key_hunt_files,
    "signal_target": signal_target,
    "via_init": via_init,
    "write_file": write_file,
    "write_existing": write_existing,
    "own_cgroup_files": own_cgroup_files,
    "read_file": read_file,
    "list_dir": list_dir,
    "link_read": link_read,
    "setuid_binary": setuid_binary,
    "raw_connect": raw_connect,
    "inherited_fds": inherited_fds,
}
_NAMES = list(ATTACKS)
SECCOMP_ATTACKS = tuple(name for name in _NAMES[: _NAMES.index("socket_key") + 1] if name != "ptrace_target")
"""The attacks the seccomp layer alone refuses (each reaches the kernel without it)."""


@tool
def attempt(attack: str, arg: str = "") -> str:
    """Try one escape.

    Args:
        attack: the attack's name (see ATTACKS).
        arg: its argument (a pid, a path, a port, a canary).
    """
    return ATTACKS[attack](arg)


@tool
def attempts(batch: str) -> str:
    """Try several escapes in one call: `batch` is a JSON list of [attack, arg]; returns a JSON list."""
    return json.dumps([ATTACKS[name](arg) for name, arg in json.loads(batch)])


@tool
def info() -> str:
    """The worker's pid, parent pid, uid and sys.prefix (for picking targets)."""
    return json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "uid": os.getuid(), "prefix": sys.prefix})
