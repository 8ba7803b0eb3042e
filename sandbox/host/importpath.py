"""Where a worker may import tool modules from.

Workers start with `-P -s` (no script directory, no current directory, no user site on `sys.path`), so
a tool cannot plant a module in its workdir for a later call to import. The folders a user's own tool
modules live in come from the supervisor instead: by default the folders on its own `sys.path` (the
current directory), minus the interpreter's own, which the worker has. Those folders are never shown
to a worker whole: the sandbox copies just the referenced modules into a private `ImportFolder` and
workers import from that alone. The worker drops any import path that a tool may write to: its workdir
and the policy's writable paths.
"""

from __future__ import annotations

import ast
import compileall
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from stockade.sandbox.paths import within_any

__all__ = ["ImportFolder", "default_import_paths", "find_module", "imports_package"]


def default_import_paths() -> list[str]:
    """The folders on this process's `sys.path` that are not the interpreter's own, and the current
    directory (as `python -m` has it; a console script's `sys.path` starts with its own bin folder)."""
    interpreter = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    found: list[str] = []
    for entry in [*sys.path, os.getcwd()]:
        folder = os.path.realpath(entry or os.getcwd())
        if os.path.isdir(folder) and not within_any(folder, interpreter) and folder not in found:
            found.append(folder)
    return found


def find_module(sources: Sequence[str], parts: list[str]) -> tuple[Path, str] | None:
    """The file or package folder in `sources` that provides module `parts` (its first regular
    package or module file), and its path relative to its source; looked up, never imported."""
    for source in sources:
        base = Path(source)
        for depth, part in enumerate(parts):
            rel = "/".join(parts[: depth + 1])
            if (base / part / "__init__.py").is_file():
                return base / part, rel
            if depth == len(parts) - 1 and (base / f"{part}.py").is_file():
                return base / f"{part}.py", f"{rel}.py"
            if not (base / part).is_dir():
                break
            base = base / part  # a namespace package: look one level deeper
    return None


def imports_package(sources: Sequence[str], refs: Iterable[str], package: str) -> bool:
    """Whether the module of some `MODULE:ATTR` reference, as found in `sources`, or a module of
    `sources` it imports (and so on), has an `import package` or `from package import` statement
    (read, never run; an import made by other means is not seen). Lets the zygote import that
    package before the worker that describes the references forks."""
    modules = [ref.partition(":")[0] for ref in refs]
    return any(package in imported for _, _, imported in user_modules(sources, modules, set()))


def user_modules(
    sources: Sequence[str], modules: list[str], seen: set[str]
) -> Iterator[tuple[Path, str, list[str]]]:
    """The file or package folder in `sources` of each of `modules` (with its path relative to the
    source and the top-level names it imports), then of each module of `sources` that one imports by
    absolute name, and theirs (see `find_module`); a module named in `seen` is skipped, and each one
    visited is added to it. Names the sources do not have (the standard library, installed packages,
    unknown ones) end the walk there."""
    pending = list(modules)
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        found = find_module(sources, module.split("."))
        if found is not None:
            imported = _imported_names(found[0])  # Parsed once: the caller reads the names too.
            yield (*found, imported)
            pending += imported


def _top_level_imports(path: Path) -> set[str]:
    """The top-level names of the absolute imports in the source file `path` (none if unreadable:
    the worker's own import will report it)."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def _imported_names(found: Path) -> list[str]:
    """The top-level names the module file or package folder `found` imports absolutely."""
    if not found.is_dir():
        return sorted(_top_level_imports(found))
    # As copied: no dot folders (a package's own `.venv`) and no byte code.
    files = [
        p
        for p in found.rglob("*.py")
        if not any(part.startswith(".") for part in p.parts[len(found.parts) :])
    ]
    return sorted(set().union(*(_top_level_imports(path) for path in files)))


# Never copied: byte code is compiled afresh from the copies, and dot files (`.env`, `.git`) are not code.
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
IMPORT_FOLDER_MODE = 0o755  # read by the workers' slot uids; written only by the supervisor


class ImportFolder:
    """A private folder holding copies of just the tool modules the references name, so a worker sees
    those and nothing else of the folders they came from (a `.env` beside `mytools.py` stays out of
    reach). A reference's module is looked up in `sources` (not imported): a top-level `name.py` is
    copied as a file, a package as its whole folder (without `__pycache__` and dot files; symlinks stay
    links, so they reach nothing a worker could not already see). Each copy is compiled to byte code
    here, which runs none of it: workers cannot write the folder, so each would compile it anew.
    Sources a tool may write to (`writable`) are skipped, so a tool cannot plant a module for a later
    worker to import."""

    def __init__(self, sources: Sequence[str], writable: Iterable[str] = ()) -> None:
        roots = [os.path.realpath(p) for p in writable]
        self.sources = [p for p in (os.path.realpath(s) for s in sources) if not within_any(p, roots)]
        self.path = tempfile.mkdtemp(prefix="stockade-imports-")
        os.chmod(self.path, IMPORT_FOLDER_MODE)
        self._copied: dict[str, Path] = {}
        """Each copy's path under the folder, and the file or package it was copied from."""
        self._seen: set[str] = set()

    def add(self, refs: Iterable[str]) -> None:
        """Copy in the module of each `MODULE:ATTR` reference not seen yet, and the modules of
        `sources` that a copy imports by absolute name, and theirs (read, never run: a helper
        module beside `mytools.py` comes too, a `.env` does not). Names the sources do not have
        (the standard library, installed packages, unknown ones) are left to the worker's import."""
        for source, rel, _ in user_modules(self.sources, [ref.partition(":")[0] for ref in refs], self._seen):
            if rel not in self._copied:
                self._copy(source, rel)

    def _copy(self, source: Path, rel: str) -> None:
        target = Path(self.path, rel)
        target.parent.mkdir(parents=True, exist_ok=True, mode=IMPORT_FOLDER_MODE)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True, ignore=_IGNORED, dirs_exist_ok=True)
            compileall.compile_dir(target, quiet=2, optimize=0)
        else:
            shutil.copy2(source, target)
            compileall.compile_file(target, quiet=2, optimize=0)
        self._copied[rel] = source

    def imports_package(self, refs: Iterable[str], package: str) -> bool:
        """Whether the copied module of some reference, or a copied module it imports, imports
        `package` (see the function)."""
        return imports_package([self.path], refs, package)

    def original(self, text: str) -> str:
        """`text` (a worker's load error) with each copy's path put back as the user's own file, so a
        `file:line:col` points at what the user edits, not at the private copy."""
        for rel, source in self._copied.items():
            text = text.replace(os.path.join(self.path, rel), str(source))
        return text

    def close(self) -> None:
        """Remove the folder (idempotent)."""
        shutil.rmtree(self.path, ignore_errors=True)
