"""What a worker may read, and the secrets no allow rule re-opens (the inputs of Landlock's rules).

`read_roots()` is the system a program needs (`/usr`, `/lib*`, `/bin`, `/etc`, `/proc`, a few
`/dev` nodes and `/sys` files) plus the interpreter, its `sys.path` and editable sources.
`denied_paths()` is the built-in deny list: credentials and histories under every home directory on
the host (as sandbox-runtime keeps) and the host's own secrets in `/etc`. Landlock only allows, so
"deny" means: `plan()` never adds a rule covering a denied path; an allowed directory containing
one is replaced by rules for its children, recursively, minus the denied ones. A policy re-opens a
denied path only by naming that exact path (or a path inside it) as a read-only or writable path.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Iterable, Mapping

from stockade.sandbox.isolation.fsconfine import interpreter_paths
from stockade.sandbox.paths import within_any

__all__ = ["FRESH_MOUNTS", "HOME_SECRETS", "SYSTEM_READ", "denied_paths", "plan", "read_roots"]

SYSTEM_READ = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/etc",
    "/proc",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/pts",
    "/dev/ptmx",
    "/sys/devices/system/cpu",  # os.cpu_count() relatives, nproc, BLAS thread pools
    "/sys/fs/cgroup",  # runtimes size themselves from their cgroup limits (writes stay denied)
    "/run/systemd/resolve",  # where /etc/resolv.conf points on systemd hosts
)
FRESH_MOUNTS = ("/proc",)
"""The read roots a worker may mount afresh in its own mount namespace (its PID namespace's `/proc`)."""
HOME_SECRETS = (
    ".ssh",
    ".aws",
    ".gnupg",
    ".config/gcloud",
    ".azure",
    ".kube",
    ".docker/config.json",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".npmrc",
    ".config/gh",
    ".config/anthropic",
    ".claude/.credentials.json",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".vault-token",
    ".password-store",
    ".local/share/keyrings",
    ".bash_history",
    ".zsh_history",
    ".sh_history",
    ".history",
    ".histfile",
    ".python_history",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    ".lesshst",
    ".local/share/fish/fish_history",
)
FIRST_PERSON_UID = 1000
"""Accounts from this uid up are people (login.defs' UID_MIN on Debian, Fedora, Arch)."""
SYSTEM_SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/security/opasswd",
)
SSH_HOST_KEYS = ("/etc/ssh", "ssh_host_", "_key")
"""The host's private ssh keys: `/etc/ssh/ssh_host_*_key` (the folder, a prefix, a suffix)."""


def read_roots() -> list[str]:
    """System directories, device nodes and the interpreter's paths (those that exist)."""
    return [p for p in (*SYSTEM_READ, *interpreter_paths()) if os.path.lexists(p)]


def _homes() -> tuple[set[str], set[str]]:
    """(every home in the user database, the homes of people): system accounts' homes such as
    `/usr/sbin` or `/bin` count only where a secret really exists in them."""
    # Not $HOME: the worker's HOME is its workdir.
    people = {"/root"}
    every = set(people)
    with contextlib.suppress(OSError, KeyError):
        for entry in pwd.getpwall():
            every.add(entry.pw_dir)
            if entry.pw_uid >= FIRST_PERSON_UID or entry.pw_dir.startswith("/home/"):
                people.add(entry.pw_dir)
    people = {h for h in people if not within_any(h, SYSTEM_READ)}
    every = {h for h in every if h.startswith("/") and h != "/" and os.path.isdir(h)}
    return every, people & every


def _dac_protected(path: str) -> bool:
    """True if file permissions alone keep this process out of `path` for good: not its owner (so
    it cannot chmod it) and no access (a folder: not even traversal). Carving such a path out of
    the rules would only cost rules (`/etc` has ~170 children) without protecting anything."""
    try:
        if os.stat(path).st_uid == os.geteuid():
            return False
    except OSError:
        return True  # unreachable
    if os.path.isdir(path):
        return not os.access(path, os.X_OK)
    return not os.access(path, os.R_OK) and not os.access(path, os.W_OK)


def denied_paths() -> set[str]:
    """Every secret on this host that this process could otherwise reach, by its path and by its
    resolved path."""
    every, people = _homes()
    # Absent secrets of a person's reachable home are denied too: one created later stays denied.
    absent_ok = {os.path.join(h, rel) for h in people if not _dac_protected(h) for rel in HOME_SECRETS}
    paths = {os.path.join(home, rel) for home in every for rel in HOME_SECRETS}
    paths.update(SYSTEM_SECRETS)
    folder, prefix, suffix = SSH_HOST_KEYS
    with contextlib.suppress(OSError):
        paths.update(
            os.path.join(folder, n) for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(suffix)
        )
    existing = {p for p in paths if os.path.lexists(p) and not _dac_protected(p)}
    absent = {p for p in absent_ok if not os.path.lexists(p)}
    resolved = {os.path.realpath(p) for p in existing}
    return {os.path.normpath(p) for p in existing | absent} | resolved


def _ancestors(paths: Iterable[str]) -> set[str]:
    """Every folder strictly above one of `paths` (normalised, absolute): the folders whose rules
    would cover a denied path."""
    found: set[str] = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in found:
            found.add(parent)
            if parent == "/":
                break
            parent = os.path.dirname(parent)
    return found


def _expand(path: str, rights: int, denied: set[str], above_denied: set[str], out: dict[str, int]) -> None:
    """Grant `rights` beneath `path`, except beneath denied paths (`above_denied`: their ancestors)."""
    if path not in above_denied:
        out[path] = out.get(path, 0) | rights
        return
    try:
        entries = sorted(os.listdir(path))
    except OSError:
        return  # unreadable: grant nothing rather than the whole folder
    for name in entries:
        child = os.path.join(path, name)
        if child not in denied:
            _expand(child, rights, denied, above_denied, out)


def plan(roots: Mapping[str, int], named: Iterable[str], denied: Iterable[str]) -> dict[str, int]:
    """Rules (path → rights) for `roots`, none covering a denied path the policy did not name.

    `named` are the paths a policy gave explicitly (workdir, read-only and writable paths): naming a
    denied path, or a path inside one, allows it.
    """
    named_set = {os.path.realpath(p) for p in named} | {os.path.normpath(p) for p in named}
    deny = {d for d in denied if d not in named_set}
    above_deny = _ancestors(deny)  # A set lookup per path: a worker plans ~180 rules as it starts.
    out: dict[str, int] = {}
    for root, rights in roots.items():
        for path in {os.path.normpath(root), os.path.realpath(root)}:
            if path not in named_set and within_any(path, deny):
                continue
            _expand(path, rights, deny, above_deny, out)
    return out
