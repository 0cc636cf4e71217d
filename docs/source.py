"""Source code taken from the real files at build time, by name, with ``ast`` (nothing is imported).

``find(path, name)`` gives the text of the top-level function, class or assignment called
``name`` in ``path``: from its first decorator to its last line, exactly as in the file, with
its line numbers.
"""

from __future__ import annotations

import ast
import functools
import pathlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Snippet:
    path: str  # relative to the repository root, with forward slashes
    name: str
    start: int  # first line, 1-based
    end: int  # last line, inclusive
    text: str


@functools.cache
def _read(path: pathlib.Path) -> tuple[str, ast.Module]:
    text = path.read_text(encoding="utf-8")
    return text, ast.parse(text, filename=str(path))


def _names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def top_level_names(root: pathlib.Path, path: str) -> list[str]:
    """The functions and classes defined at the top of ``path``, in file order."""
    file = root / path
    if not file.exists():
        return []
    _, tree = _read(file)
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def find(root: pathlib.Path, path: str, name: str) -> Snippet | None:
    """The top-level definition of ``name`` in ``root / path``, or None if the file has none."""
    file = root / path
    if not file.exists():
        return None
    text, tree = _read(file)
    for node in tree.body:
        if name in _names(node):
            decorators = getattr(node, "decorator_list", [])
            start = min([node.lineno, *(d.lineno for d in decorators)])
            lines = text.splitlines()[start - 1 : node.end_lineno]
            return Snippet(path, name, start, node.end_lineno, "\n".join(lines) + "\n")
    return None


def clear_cache() -> None:
    """Forget the files read so far (a build reads each once; the next one must see edits)."""
    _read.cache_clear()
