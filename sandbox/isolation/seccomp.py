"""The seccomp layer: a classic BPF filter that refuses, with EPERM, the syscalls tools never need.

Refused: debugging and cross-process memory (`ptrace`, `process_vm_readv/writev`, `pidfd_getfd`),
kernel attack surface (`bpf`, `perf_event_open`, `userfaultfd`, `io_uring_*`), keyrings (`keyctl`,
`add_key`, `request_key`), namespaces and mounts (`mount`, `umount2`, `pivot_root`, `unshare`,
`setns`, the new mount API, `clone` with any `CLONE_NEW*` flag), `kexec_*` and module loading, and
`socket()` of any family but AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK (IP sockets of type SOCK_RAW
or SOCK_PACKET refused too).
AF_NETLINK stays because glibc's `getaddrinfo(AI_ADDRCONFIG)` and `ip`/`ss` read routes through it;
changing them needs CAP_NET_ADMIN, which the worker never has.

`clone3` gets ENOSYS: its flags live in memory a filter cannot read, and glibc falls back to `clone`
on ENOSYS (as under container runtimes), whose flags the filter checks. A foreign architecture
(i386 via int 0x80) and the x32 ABI get EPERM for every syscall. Installed last, just before tool
modules are imported: the namespace and keyring steps before it need the very syscalls it refuses.

A second, smaller filter from the same builder (`forbid_setid_modes`) goes on earlier, before any
writable folder is idmapped: through an idmapped folder a file the slot uid creates is stored as the
folder's owner (root, for a root-owned folder), so a set-user-ID or set-group-ID bit on it would leave
a set-ID program of that owner on the host's disk. It refuses (EPERM) every mode argument carrying
those bits; `openat2`, whose mode sits in a struct a filter cannot read, gets ENOSYS (libcs fall back).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass

__all__ = [
    "Arch",
    "apply_seccomp",
    "build_filter",
    "build_setid_filter",
    "forbid_setid_modes",
    "host_arch",
    "seccomp_probe",
]

# BPF opcodes (linux/bpf_common.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_OFF_NR, _OFF_ARCH = 0, 4


def _off_arg_lo(index: int) -> int:
    return 16 + 8 * index  # struct seccomp_data: args[] after nr, arch, ip; low word first (LE)


_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (NEWTIME is clone3/unshare only).
_CLONE_NS_FLAGS = 0x7E020000
_SETID_BITS = 0o6000
_SYS_OPENAT2 = 437  # the same number on every architecture the filter knows
_LOCAL_FAMILIES = (1, 16)  # AF_UNIX, AF_NETLINK (netlink sockets are SOCK_RAW by design)
_IP_FAMILIES = (2, 10)  # AF_INET, AF_INET6: any type but raw
_SOCK_TYPE_MASK = 0xF
_REFUSED_SOCK_TYPES = (3, 10)  # SOCK_RAW, SOCK_PACKET

# Numbers shared by every architecture since the unified table (424+).
_COMMON = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
}


@dataclass(frozen=True)
class Arch:
    """One architecture's audit id and the syscall numbers the filter needs."""

    name: str
    audit: int
    refused: dict[str, int]
    socket: int
    clone: int
    clone3: int
    seccomp: int
    x32: bool
    mode_args: dict[int, int]
    """Syscall number -> index of its mode argument (the calls that create or chmod a file)."""


X86_64 = Arch(
    name="x86_64",
    audit=0xC000003E,
    refused={
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "unshare": 272,
        "setns": 308,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        **_COMMON,
    },
    socket=41,
    clone=56,
    clone3=435,
    seccomp=317,
    x32=True,
    # open, creat, openat, mkdir, mkdirat, chmod, fchmod, fchmodat, fchmodat2, mknod, mknodat
    mode_args={2: 2, 85: 1, 257: 3, 83: 1, 258: 2, 90: 1, 91: 1, 268: 2, 452: 2, 133: 1, 259: 2},
)
AARCH64 = Arch(
    name="aarch64",
    audit=0xC00000B7,
    refused={
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "unshare": 97,
        "setns": 268,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        **_COMMON,
    },
    socket=198,
    clone=220,
    clone3=435,
    seccomp=277,
    x32=False,
    # openat, mkdirat, fchmod, fchmodat, fchmodat2, mknodat (no legacy open/creat/mkdir/chmod/mknod)
    mode_args={56: 3, 34: 2, 52: 1, 53: 2, 452: 2, 33: 2},
)
_ARCHES = {"x86_64": X86_64, "amd64": X86_64, "aarch64": AARCH64, "arm64": AARCH64}


def host_arch() -> Arch:
    """The running architecture; OSError(ENOSYS) where the filter has no syscall table for it."""
    machine = os.uname().machine.lower()
    if machine not in _ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp syscall table for {machine or 'this machine'}")
    return _ARCHES[machine]


class _Prog:
    """Instructions with symbolic jump targets: each jump names a label resolved at the end."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int, int | str, int | str]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        self.code.append((code, k, jt, jf))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = bytearray()
        for index, (code, k, jt, jf) in enumerate(self.code):
            out += struct.pack("<HBBI", code, self._target(index, jt), self._target(index, jf), k)
        return bytes(out)

    def _target(self, index: int, jump: int | str) -> int:
        if isinstance(jump, int):
            return jump
        offset = self.labels[jump] - index - 1
        if not 0 <= offset <= 255:
            raise ValueError(f"jump to {jump} out of range")
        return offset


def _prologue(arch: Arch) -> _Prog:
    """A program that refuses a foreign ABI (and x32) with EPERM and loads the syscall number."""
    p = _Prog()
    p.op(_LD_W_ABS, _OFF_ARCH)
    p.op(_JEQ_K, arch.audit, 0, "eperm")
    p.op(_LD_W_ABS, _OFF_NR)
    if arch.x32:
        p.op(_JGE_K, _X32_SYSCALL_BIT, "eperm", 0)
    return p


def _epilogue(p: _Prog) -> bytes:
    """The shared returns every jump of the prologue and the body may target, then the program."""
    p.label("enosys")
    p.op(_RET_K, _RET_ERRNO | errno.ENOSYS)
    p.label("eperm")
    p.op(_RET_K, _RET_ERRNO | errno.EPERM)
    return p.assemble()


def build_filter(arch: Arch) -> bytes:
    """The filter for `arch` as packed `struct sock_filter` instructions."""
    p = _prologue(arch)
    for number in sorted(set(arch.refused.values())):
        p.op(_JEQ_K, number, "eperm", 0)
    p.op(_JEQ_K, arch.clone3, "enosys", 0)
    p.op(_JEQ_K, arch.clone, "clone", 0)
    p.op(_JEQ_K, arch.socket, "socket", 0)
    p.op(_RET_K, _RET_ALLOW)
    p.label("clone")
    p.op(_LD_W_ABS, _off_arg_lo(0))  # clone(flags, ...) on both x86_64 and aarch64
    p.op(_JSET_K, _CLONE_NS_FLAGS, "eperm", 0)
    p.op(_RET_K, _RET_ALLOW)
    p.label("socket")
    p.op(_LD_W_ABS, _off_arg_lo(0))
    for family in _LOCAL_FAMILIES:
        p.op(_JEQ_K, family, "allow", 0)
    for family in _IP_FAMILIES:
        p.op(_JEQ_K, family, "socket_type", 0)
    p.op(_RET_K, _RET_ERRNO | errno.EPERM)
    p.label("socket_type")
    p.op(_LD_W_ABS, _off_arg_lo(1))
    p.op(_AND_K, _SOCK_TYPE_MASK)
    for sock_type in _REFUSED_SOCK_TYPES:
        p.op(_JEQ_K, sock_type, "eperm", 0)
    p.label("allow")
    p.op(_RET_K, _RET_ALLOW)
    return _epilogue(p)


def build_setid_filter(arch: Arch) -> bytes:
    """The set-ID filter for `arch`: EPERM for a mode argument with a set-ID bit (module docstring)."""
    p = _prologue(arch)
    p.op(_JEQ_K, _SYS_OPENAT2, "enosys", 0)
    for number, arg in arch.mode_args.items():
        p.op(_JEQ_K, number, f"mode{arg}", 0)
    p.op(_RET_K, _RET_ALLOW)
    for arg in sorted(set(arch.mode_args.values())):
        p.label(f"mode{arg}")
        p.op(_LD_W_ABS, _off_arg_lo(arg))
        p.op(_JSET_K, _SETID_BITS, "eperm", 0)
        p.op(_RET_K, _RET_ALLOW)
    return _epilogue(p)


def _libc() -> ctypes.CDLL:
    # The symbols already loaded in this process: find_library would spawn ldconfig (~100 ms).
    return ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install(arch: Arch, program: bytes) -> None:
    """Install `program` on every thread of this process (needs no_new_privs or CAP_SYS_ADMIN);
    OSError when the kernel refuses."""
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(
        ctypes.c_long(arch.seccomp),
        ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
        ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(prog),
    )
    if result != 0:
        err = ctypes.get_errno() if result < 0 else errno.EBUSY  # >0: a thread that cannot sync
        raise OSError(err, f"seccomp(SET_MODE_FILTER): {os.strerror(err)}")


def apply_seccomp() -> str:
    """Install the layer's filter. Returns a human detail; raises OSError when the kernel refuses
    or the arch is unknown."""
    arch = host_arch()
    _install(arch, build_filter(arch))
    return f"{arch.name}, {len(arch.refused)} syscalls + clone namespaces + socket families refused"


def forbid_setid_modes() -> None:
    """Install the set-ID filter in this process and all it starts (irrevocable). Raises OSError
    where it cannot be installed: the caller then does not idmap."""
    arch = host_arch()
    _install(arch, build_setid_filter(arch))


def seccomp_probe() -> str:
    """Install the filter in this (throwaway, no_new_privs) process and check it refuses unshare."""
    detail = apply_seccomp()
    libc = _libc()
    if libc.unshare(ctypes.c_int(0)) == 0 or ctypes.get_errno() != errno.EPERM:
        raise OSError(errno.EINVAL, "filter installed but unshare was not refused")
    return detail
