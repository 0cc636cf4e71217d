"""A backend's code, read from its real file when the notebook runs (never a copy that can drift).

``find(backend, file, name)`` is the text of the top-level function or class ``name`` (or one
method, ``"Class.method"``) in ``<backend>_impl/<file>``, from its first decorator to its last
line, with its line numbers. The file is located through the imported package, so a notebook
run against another checkout (``PYTHONPATH``) shows that checkout's code.
"""

from __future__ import annotations

import ast
import html
import importlib.util
import inspect
import pathlib
from dataclasses import dataclass

from transformer_backends.names import BACKENDS, package


@dataclass(frozen=True)
class Snippet:
    backend: str
    path: str  # <backend>_impl/<file>
    name: str
    start: int  # first line, 1-based
    end: int  # last line, inclusive
    text: str


def backend_file(backend: str, file: str) -> pathlib.Path:
    """The path of ``file`` inside the backend's package, found without importing the package."""
    spec = importlib.util.find_spec(package(backend))
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the {backend} backend ({package(backend)}) is not importable")
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / file
    if not path.exists():
        raise FileNotFoundError(f"{package(backend)} has no file {file!r}")
    return path


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    return isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name


def find(backend: str, file: str, name: str) -> Snippet:
    """The definition of ``name`` ("function", "Class" or "Class.method") in the backend's ``file``.
    A module's forward is ``Class.__call__`` in NumPy and Flax NNX and ``Class.forward`` in torch:
    either name finds each backend's own."""
    if backend == "torch" and name.endswith(".__call__"):
        name = name.removesuffix(".__call__") + ".forward"
    elif backend != "torch" and name.endswith(".forward"):
        name = name.removesuffix(".forward") + ".__call__"
    path = backend_file(backend, file)
    try:
        start, end, code = cut(path, name)
    except LookupError:
        raise LookupError(f"{package(backend)}/{file} defines no {name!r}") from None
    return Snippet(backend, f"{package(backend)}/{file}", name, start, end, code)


def cut(path: pathlib.Path, name: str) -> tuple[int, int, str]:
    """(first line, last line, text) of the definition of ``name`` ("f", "Class" or "Class.method")
    in ``path``, from its first decorator, dedented; LookupError when the file has none."""
    text = path.read_text(encoding="utf-8")
    body = ast.parse(text, filename=str(path)).body
    node = None
    for part in name.split("."):
        node = next((n for n in body if _defines(n, part)), None)
        if node is None:
            raise LookupError(f"{path} defines no {name!r}")
        body = getattr(node, "body", [])
    decorators = getattr(node, "decorator_list", [])
    start = min([node.lineno, *(d.lineno for d in decorators)])
    lines = text.splitlines()[start - 1 : node.end_lineno]
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return start, node.end_lineno, "\n".join(line[indent:] for line in lines) + "\n"


class Code:
    """Three columns of real code, one per backend; HTML in a notebook, plain text elsewhere."""

    def __init__(self, snippets: list[Snippet]):
        self.snippets = snippets

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return "\n".join(f"# {s.path}, lines {s.start}-{s.end}\n{s.text}" for s in self.snippets)

    def _repr_html_(self) -> str:
        columns = "".join(
            '<div style="flex:1 1 640px;min-width:0;overflow-x:auto">'
            f"<div><b>{html.escape(s.backend)}</b> <code>{html.escape(s.path)}</code>, "
            f"lines {s.start}&ndash;{s.end}</div>"
            f'<pre class="course-code" style="font-size:11px;line-height:1.3">{html.escape(s.text)}</pre></div>'
            for s in self.snippets
        )
        # side by side where a 100-character line fits each column, one under another where not
        return f'<div class="course-three" style="display:flex;flex-wrap:wrap;gap:12px">{columns}</div>'


def show_shared(obj) -> Code:
    """A function or class of the code the backends share (``transformer_run``, ``transformer_convert``,
    ...), read from its file now: one column, since it is written once for all three."""
    path = pathlib.Path(inspect.getsourcefile(obj))
    package = obj.__module__.split(".")[0]
    root = pathlib.Path(importlib.util.find_spec(package).submodule_search_locations[0]).parent
    start, end, code = cut(path, obj.__name__)
    relative = path.relative_to(root).as_posix()
    return Code([Snippet("shared by the three backends", relative, obj.__name__, start, end, code)])


def show(file: str, name: str, backends: tuple[str, ...] = BACKENDS) -> Code:
    """``name`` from ``file`` in every backend, side by side, read from the files now."""
    return Code([find(backend, file, name) for backend in backends])
