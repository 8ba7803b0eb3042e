"""Path containment, the one rule every layer uses: is a path a folder or somewhere below it.

Plain string tests on paths the caller has already normalised (`os.path.realpath` or `normpath`):
`/a/bc` is not inside `/a/b`.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["below", "below_any", "within", "within_any"]


def within(path: str, root: str) -> bool:
    """`path` is `root` or below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def within_any(path: str, roots: Iterable[str]) -> bool:
    """`path` is one of `roots` or below one."""
    return any(within(path, root) for root in roots)


def below(path: str, root: str) -> bool:
    """`path` is strictly below `root` (not `root` itself)."""
    return path != root and within(path, root)


def below_any(path: str, roots: Iterable[str]) -> bool:
    """`path` is strictly below one of `roots` (not one of them)."""
    return any(below(path, root) for root in roots)
