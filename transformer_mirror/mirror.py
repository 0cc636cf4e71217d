"""The mirror report: where the three backends differ, statement by statement.

A learner diffs ``numpy_impl/attention.py`` against ``torch_impl/attention.py`` and should
read a translation. This module makes that diff a number and a list. For every module file
present in all three packages it pairs functions and methods by qualified name
(``Class.method``; a NumPy or JAX ``__call__`` pairs with a torch ``forward``), rewrites the
framework tokens of each to one spelling (``NORMALISATION`` below: ``np.``/``jnp.``/``torch.``,
``axis``/``dim``, ...), and compares the two statement sequences with difflib, comments and
docstrings aside. Two pairs are compared: JAX against torch, and the NumPy forward against
torch.

What still differs is a *difference*: a hunk of that diff, statements of one backend
replaced by, missing from or added to the other's. It counts as many differing statements
as its longer side has. Each needs a reason from ``transformer_mirror.differences.REASONS``,
pointed at by a comment ``# differs: <reason-id>`` on a line of one of its statements (or
on a comment line directly above one), in either backend's file. A function that exists in one backend only is one
difference as long as the function; a marker on its ``def`` line explains all of it.

NumPy's hand-written backward (functions and methods named ``backward`` or ``*_backward``,
which includes the ``*_for_backward`` forwards that keep what it needs) has no torch
counterpart (torch has autograd): it is listed as one group with the reason
``numpy-backward``, not compared.

Standard library only (ast, tokenize, difflib): ``transformer_mirror`` imports no framework.
``transformer-ref mirror`` prints the report, the docs page "Where the backends differ"
shows it, and ``shared_tests/repository/test_mirror.py`` fails on a difference without a reason.
"""

from __future__ import annotations

import ast
import copy
import difflib
import io
import pathlib
import re
import textwrap
import tokenize
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from transformer_backends.names import BACKENDS, package

from .differences import NUMPY_BACKWARD, ONE_BACKEND_FILES, PER_BACKEND_FILES, REASONS

PACKAGES = {backend: package(backend) for backend in BACKENDS}
# pair name -> (the other backend, torch): torch is the text the others are read against
PAIRS = {"jax-torch": ("jax", "torch"), "numpy-torch": ("numpy", "torch")}
MARKER = re.compile(r"\bdiffers:\s*([A-Za-z0-9_-]+)")
ROOT = pathlib.Path(__file__).resolve().parent.parent


# ==================================================================== the normalisation table
# Everything that makes a true translation compare equal, in one place. Rules apply to the
# syntax tree (so ``torch.cat`` inside a string is left alone), in this order: module
# prefixes first, then names, then the call forms.

# np.exp / jnp.exp / torch.exp -> xp.exp (a framework's array namespace)
FRAMEWORK_MODULES = {"np": "xp", "numpy": "xp", "jnp": "xp", "torch": "xp"}

# names after the prefix rule: the same function spelled two ways
RENAMED_NAMES = {
    "xp.cat": "xp.concatenate",  # torch.cat(xs, dim=d) = np.concatenate(xs, axis=d)
    "xp.amax": "xp.max",
    "xp.amin": "xp.min",
    "xp.clamp": "xp.clip",
    "xp.tensor": "xp.asarray",
    "xp.as_tensor": "xp.asarray",
    "xp.array": "xp.asarray",
    "xp.bool": "bool",  # dtype=torch.bool / dtype=np.bool_ / dtype=bool
    "xp.bool_": "bool",
    "xp.inf": "math.inf",
    "xp.pi": "math.pi",
    "xp.Tensor": "Array",  # isinstance(x, torch.Tensor / np.ndarray / jax.Array)
    "xp.ndarray": "Array",
    "jax.Array": "Array",
    "xp.gather": "xp.take_along_axis",  # argument order: see _gather
    "xp.repeat_interleave": "xp.repeat",  # torch.repeat_interleave(x, n, dim=d) = np.repeat(x, n, axis=d)
    "xp.sigmoid": "sigmoid",  # torch.sigmoid
    "jax.nn.sigmoid": "sigmoid",
    "expit": "sigmoid",  # scipy.special.expit, NumPy's (imported by name, as erf is)
}

# methods of an array or a module: x.amax(...) -> x.max(...)
RENAMED_METHODS = {
    "forward": "__call__",  # torch's nn.Module calls forward; NumPy and NNX modules __call__
    "amax": "max",
    "amin": "min",
    "clamp": "clip",
    "clone": "copy",
    "to": "astype",  # x.to(dtype)
    "permute": "transpose",  # x.permute(0, 2, 1, 3) = x.transpose(0, 2, 1, 3) in NumPy
}

# keyword arguments
RENAMED_KEYWORDS = {"dim": "axis", "keepdim": "keepdims"}

# wrappers a framework needs around a value that is the same in all three: f(x) -> x
UNWRAPPED = {
    "nnx.Param": "a Flax parameter (NumPy: a plain array)",
    "nn.Parameter": "a torch parameter (NumPy: a plain array)",
    "Buffer": "jax_impl's non-trainable nnx.Variable (torch: register_buffer, NumPy: an attribute)",
    "nnx.List": "Flax NNX's list of submodules (NumPy: a list)",
    "nn.ModuleList": "torch's list of submodules (NumPy: a list)",
    "_torch_dtype": "torch's dtype object for a dtype name",
}

# statements a framework demands and the others have no use for
DROPPED_STATEMENTS = {"super().__init__()": "nn.Module's constructor"}

# methods that reduce over an axis: x.mean(-1) -> x.mean(axis=-1)
REDUCTIONS = {"sum", "mean", "max", "min", "any", "all", "prod", "std", "var", "argmax", "argmin", "cumsum"}
# functions whose second positional argument is an axis: xp.stack(xs, 1) -> xp.stack(xs, axis=1)
AXIS_SECOND = {"xp.concatenate", "xp.stack", "xp.softmax", "xp.log_softmax"}
# functions whose first arguments are a shape: torch.zeros(a, b) -> xp.zeros((a, b))
SHAPE_FIRST = {"xp.zeros", "xp.ones", "xp.empty", "xp.full"}


def _matmul(node: ast.Call, backend: str) -> ast.AST | None:
    """xp.matmul(a, b) -> a @ b (only without extra arguments: precision= is a difference)."""
    if _dotted(node.func) == "xp.matmul" and len(node.args) == 2 and not node.keywords:
        return ast.BinOp(node.args[0], ast.MatMult(), node.args[1])
    return None


def _swapaxes(node: ast.Call, backend: str) -> ast.AST | None:
    """np.swapaxes(a, i, j) and torch's a.transpose(i, j) -> a.swapaxes(i, j)."""
    if _dotted(node.func) == "xp.swapaxes" and len(node.args) == 3:
        return _method(node.args[0], "swapaxes", node.args[1:])
    if _is_method(node, "transpose") and len(node.args) == 2 and not node.keywords:
        return _method(node.func.value, "swapaxes", node.args)
    return None


def _axis_keyword(node: ast.Call, backend: str) -> ast.AST | None:
    """x.mean(-1) -> x.mean(axis=-1); xp.stack(xs, 1) -> xp.stack(xs, axis=1)."""
    has_axis = any(k.arg == "axis" for k in node.keywords)
    if _is_method(node, *REDUCTIONS) and len(node.args) == 1 and not has_axis:
        node.keywords.insert(0, ast.keyword("axis", node.args.pop()))
        return node
    if _dotted(node.func) in AXIS_SECOND and len(node.args) == 2 and not has_axis:
        node.keywords.insert(0, ast.keyword("axis", node.args.pop()))
        return node
    return None


def _shape_tuple(node: ast.Call, backend: str) -> ast.AST | None:
    """torch.zeros(a, b, dtype=t) -> xp.zeros((a, b), dtype=t); np.zeros((a, b), t) and np.zeros(a, t) -> the same."""
    if _dotted(node.func) not in SHAPE_FIRST or not node.args:
        return None
    if backend == "torch" and _dotted(node.func) != "xp.full":  # every positional argument is a size
        sizes = node.args[0].elts if len(node.args) == 1 and isinstance(node.args[0], ast.Tuple) else node.args
        node.args = [ast.Tuple(list(sizes), ast.Load())]
        return node
    shape, rest = node.args[0], node.args[1:]  # NumPy and JAX: the shape, then maybe the dtype
    if rest and _dotted(node.func) != "xp.full" and not any(k.arg == "dtype" for k in node.keywords):
        node.keywords.insert(0, ast.keyword("dtype", rest.pop(0)))
    elts = shape.elts if isinstance(shape, (ast.Tuple, ast.List)) else [shape]
    node.args = [ast.Tuple(list(elts), ast.Load()), *rest]
    return node


def _shape_reads(node: ast.Call, backend: str) -> ast.AST | None:
    """x.size(i) -> x.shape[i]; x.dim() -> x.ndim; x.numel() -> x.size; tuple(x.shape) -> x.shape."""
    if _is_method(node, "size") and len(node.args) == 1:
        return ast.Subscript(ast.Attribute(node.func.value, "shape", ast.Load()), node.args[0], ast.Load())
    if _is_method(node, "dim") and not node.args:
        return ast.Attribute(node.func.value, "ndim", ast.Load())
    if _is_method(node, "numel") and not node.args:
        return ast.Attribute(node.func.value, "size", ast.Load())
    if _dotted(node.func) == "tuple" and len(node.args) == 1:
        arg = node.args[0]
        if isinstance(arg, ast.Attribute) and arg.attr == "shape":
            return arg
    return None


def _lookup(node: ast.Call, backend: str) -> ast.AST | None:
    """F.embedding(ids, weight) -> weight[ids]."""
    if _dotted(node.func) == "F.embedding" and len(node.args) == 2 and not node.keywords:
        return ast.Subscript(node.args[1], node.args[0], ast.Load())
    return None


def _masked_fill(node: ast.Call, backend: str) -> ast.AST | None:
    """x.masked_fill(~m, v) -> xp.where(m, x, v); x.masked_fill(m, v) -> xp.where(m, v, x)."""
    if not (_is_method(node, "masked_fill") and len(node.args) == 2):
        return None
    mask, value = node.args
    where = ast.Attribute(ast.Name("xp", ast.Load()), "where", ast.Load())
    if isinstance(mask, ast.UnaryOp) and isinstance(mask.op, ast.Invert):
        return ast.Call(where, [mask.operand, node.func.value, value], [])
    return ast.Call(where, [mask, value, node.func.value], [])


def _stop_gradient(node: ast.Call, backend: str) -> ast.AST | None:
    """jax.lax.stop_gradient(x) -> x.detach()."""
    if _dotted(node.func) == "jax.lax.stop_gradient" and len(node.args) == 1:
        return _method(node.args[0], "detach", [])
    return None


def _gather(node: ast.Call, backend: str) -> ast.AST | None:
    """torch.gather(a, d, i) -> xp.take_along_axis(a, i, axis=d) (after RENAMED_NAMES)."""
    if _dotted(node.func) == "xp.take_along_axis" and len(node.args) == 3 and not node.keywords:
        a, axis, index = node.args
        return ast.Call(node.func, [a, index], [ast.keyword("axis", axis)])
    return None


# Call forms, each a function of one ast.Call (after prefixes, names and keywords) and the
# backend ("numpy", "jax", "torch"): returns what replaces it, or None to leave it.
CALL_RULES: tuple[Callable[[ast.Call, str], ast.AST | None], ...] = (
    _matmul,
    _swapaxes,
    _axis_keyword,
    _shape_tuple,
    _shape_reads,
    _lookup,
    _masked_fill,
    _stop_gradient,
    _gather,
)
# Also: annotations are dropped (np.ndarray / jax.Array / torch.Tensor), ``x[...]`` (reading
# a Flax Variable's array) is ``x``, and ``self.register_buffer("pe", value, ...)`` is
# ``self.pe = value``.


def normalisation_table() -> list[tuple[str, str]]:
    """(rule, what it does): the table above, for the CLI and the docs page."""
    rows = [(f"{', '.join(k + '.' for k in FRAMEWORK_MODULES)}", "xp. (the array namespace)")]
    rows += [(old, new) for old, new in RENAMED_NAMES.items()]
    rows += [(f".{old}(", f".{new}(") for old, new in RENAMED_METHODS.items()]
    rows += [(f"{old}=", f"{new}=") for old, new in RENAMED_KEYWORDS.items()]
    rows += [(f"{name}(x)", f"x: {why}") for name, why in UNWRAPPED.items()]
    rows += [(text, f"dropped: {why}") for text, why in DROPPED_STATEMENTS.items()]
    rows += [(rule.__name__.strip("_"), rule.__doc__.splitlines()[0]) for rule in CALL_RULES]
    rows += [
        ("annotations", "dropped (np.ndarray / jax.Array / torch.Tensor)"),
        ("x[...]", "x (reading a Flax Variable's array)"),
        ('self.register_buffer("pe", value)', "self.pe = value"),
    ]
    return rows


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` -> "a.b.c"; anything else -> None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _is_method(node: ast.Call, *names: str) -> bool:
    return (
        isinstance(node.func, ast.Attribute)
        and node.func.attr in names
        and _dotted(node.func) not in (f"xp.{n}" for n in names)
    )


def _method(obj: ast.AST, name: str, args: list[ast.AST]) -> ast.Call:
    return ast.Call(ast.Attribute(obj, name, ast.Load()), list(args), [])


def _from_dotted(text: str) -> ast.AST:
    return ast.parse(text, mode="eval").body


class _Normaliser(ast.NodeTransformer):
    def __init__(self, backend: str):
        self.backend = backend

    def visit_Name(self, node: ast.Name) -> ast.AST:  # noqa: N802
        if node.id in RENAMED_NAMES:  # a function imported by name (scipy's expit)
            return ast.copy_location(_from_dotted(RENAMED_NAMES[node.id]), node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:  # noqa: N802
        self.generic_visit(node)
        dotted = _dotted(node)
        if dotted is not None:
            head, _, rest = dotted.partition(".")
            if head in FRAMEWORK_MODULES:
                dotted = f"{FRAMEWORK_MODULES[head]}.{rest}"
            if dotted in RENAMED_NAMES:
                return ast.copy_location(_from_dotted(RENAMED_NAMES[dotted]), node)
            if dotted.partition(".")[0] == "xp":
                return ast.copy_location(_from_dotted(dotted), node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:  # noqa: N802
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr in RENAMED_METHODS:
            if _dotted(node.func) is None or not _dotted(node.func).startswith("xp."):
                node.func.attr = RENAMED_METHODS[node.func.attr]
        for keyword in node.keywords:
            keyword.arg = RENAMED_KEYWORDS.get(keyword.arg, keyword.arg)
        if _dotted(node.func) in UNWRAPPED and len(node.args) == 1 and not node.keywords:
            return node.args[0]
        for rule in CALL_RULES:
            replaced = rule(node, self.backend)
            if replaced is not None and replaced is not node:
                return ast.copy_location(self.visit(replaced), node)
        return node

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:  # noqa: N802
        self.generic_visit(node)
        if isinstance(node.slice, ast.Constant) and node.slice.value is Ellipsis and isinstance(node.ctx, ast.Load):
            return node.value
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:  # noqa: N802
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:  # noqa: N802
        self.generic_visit(node)
        node.returns = None
        if node.name == "forward":
            node.name = RENAMED_METHODS["forward"]
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:  # noqa: N802
        self.generic_visit(node)
        if node.value is None:
            return None
        return ast.copy_location(ast.Assign([node.target], node.value), node)

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:  # noqa: N802
        self.generic_visit(node)
        if ast.unparse(node) in DROPPED_STATEMENTS:
            return None
        call = node.value
        if isinstance(call, ast.Call) and _dotted(call.func) == "self.register_buffer" and len(call.args) >= 2:
            name = call.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                target = ast.Attribute(ast.Name("self", ast.Load()), name.value, ast.Store())
                return ast.copy_location(ast.Assign([target], call.args[1]), node)
        return node


def normalise(node: ast.AST, backend: str) -> ast.AST:
    """A normalised copy of ``node``, from ``backend``'s source (line numbers kept)."""
    return _Normaliser(backend).visit(copy.deepcopy(node))


# ==================================================================== statements of a function
@dataclass(frozen=True)
class Statement:
    text: str  # normalised, indented by its depth: what is compared
    line: int  # its first line in the file
    end: int  # its last line (of a compound statement: of its header)
    source: str  # its lines as in the file, dedented
    reasons: tuple[str, ...]  # the ``# differs:`` markers on its lines or on a comment line just above
    first: int  # ``line``, or the line above it when that is a comment line


@dataclass(frozen=True)
class Function:
    name: str  # qualified and normalised: "MultiHeadAttention.__call__"
    written: str  # as in the file: "MultiHeadAttention.forward"
    line: int
    statements: tuple[Statement, ...]

    @property
    def reasons(self) -> tuple[str, ...]:
        """The markers on its ``def`` line(s): explain the whole function, when it has no counterpart."""
        return self.statements[0].reasons


@dataclass
class SourceFile:
    backend: str  # "numpy", "jax" or "torch"
    path: str  # relative to the root: "torch_impl/attention.py"
    lines: list[str]
    markers: dict[int, list[str]]  # line -> reason ids
    functions: dict[str, Function]


def _markers(text: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            ids = MARKER.findall(token.string)
            if ids:
                found.setdefault(token.start[0], []).extend(ids)
    return found


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


class _Flattener:
    """A function's body -> its statements in order; a compound statement is its header
    (``if test:``, ``for x in xs:``, ``else:``), then its body one level deeper."""

    def __init__(self, file: SourceFile):
        self.file, self.out = file, []

    def add(self, text: str, depth: int, line: int, end: int) -> None:
        source = textwrap.dedent("\n".join(self.file.lines[line - 1 : end]))
        first = line - 1 if line > 1 and self.file.lines[line - 2].lstrip().startswith("#") else line
        reasons = tuple(r for n in range(first, end + 1) for r in self.file.markers.get(n, ()))
        self.out.append(Statement("    " * depth + text, line, end, source, reasons, first))

    def header_end(self, node: ast.stmt, body: list[ast.stmt]) -> int:
        """The last line of a compound statement's header: before its body, comments skipped."""
        end = body[0].lineno - 1
        while end > node.lineno and self.file.lines[end - 1].strip()[:1] in ("", "#"):
            end -= 1
        return max(end, node.lineno)

    def keyword_line(self, keyword: str, after: int, before: int) -> int:
        """The line of an ``else:`` / ``finally:``, which the syntax tree does not keep."""
        for n in range(after + 1, before):
            if self.file.lines[n - 1].strip().startswith(keyword):
                return n
        return before

    def body(self, nodes: Iterable[ast.stmt], depth: int) -> None:
        for node in nodes:
            if not _is_docstring(node):
                self.statement(node, depth)

    def statement(self, node: ast.stmt, depth: int, keyword: str = "if") -> None:
        if isinstance(node, ast.If):
            self.add(f"{keyword} {ast.unparse(node.test)}:", depth, node.lineno, self.header_end(node, node.body))
            self.body(node.body, depth + 1)
            self.orelse(node, node.orelse, depth)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            text = f"for {ast.unparse(node.target)} in {ast.unparse(node.iter)}:"
            self.add(text, depth, node.lineno, self.header_end(node, node.body))
            self.body(node.body, depth + 1)
            self.orelse(node, node.orelse, depth)
        elif isinstance(node, ast.While):
            self.add(f"while {ast.unparse(node.test)}:", depth, node.lineno, self.header_end(node, node.body))
            self.body(node.body, depth + 1)
            self.orelse(node, node.orelse, depth)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            items = ", ".join(ast.unparse(item) for item in node.items)
            self.add(f"with {items}:", depth, node.lineno, self.header_end(node, node.body))
            self.body(node.body, depth + 1)
        elif isinstance(node, ast.Try):
            self.add("try:", depth, node.lineno, node.lineno)
            self.body(node.body, depth + 1)
            for handler in node.handlers:
                name = f" as {handler.name}" if handler.name else ""
                kind = f" {ast.unparse(handler.type)}" if handler.type else ""
                self.add(f"except{kind}{name}:", depth, handler.lineno, self.header_end(handler, handler.body))
                self.body(handler.body, depth + 1)
            self.orelse(node, node.orelse, depth)
            if node.finalbody:
                line = self.keyword_line("finally", node.lineno, node.finalbody[0].lineno)
                self.add("finally:", depth, line, line)
                self.body(node.finalbody, depth + 1)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.add(_signature(node), depth, node.lineno, self.header_end(node, node.body))
            self.body(node.body, depth + 1)
        elif isinstance(node, ast.ClassDef):
            self.add(f"class {node.name}:", depth, node.lineno, self.header_end(node, node.body))
            self.body(node.body, depth + 1)
        else:
            self.add(ast.unparse(node), depth, node.lineno, node.end_lineno)

    def orelse(self, node: ast.stmt, orelse: list[ast.stmt], depth: int) -> None:
        if not orelse:
            return
        first = orelse[0]
        if len(orelse) == 1 and isinstance(first, ast.If) and self.file.lines[first.lineno - 1].lstrip()[:4] == "elif":
            self.statement(first, depth, keyword="elif")
            return
        line = self.keyword_line("else", _last_line(node, orelse), first.lineno)
        self.add("else:", depth, line, line)
        self.body(orelse, depth + 1)


def _last_line(node: ast.stmt, orelse: list[ast.stmt]) -> int:
    """The last line of ``node`` before its ``else:`` (its body, or its last handler)."""
    before = [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt | ast.excepthandler) and n not in orelse]
    return max(n.end_lineno for n in before)


def _signature(node: ast.FunctionDef) -> str:
    return f"def {node.name}({ast.unparse(node.args)}):"


def read_source(root: pathlib.Path, backend: str, file: str) -> SourceFile:
    """``file`` of ``backend``: its functions and methods, normalised, with their statements and markers."""
    path = f"{PACKAGES[backend]}/{file}"
    text = (root / path).read_text(encoding="utf-8")
    file = SourceFile(backend, path, text.splitlines(), _markers(text), {})
    tree = ast.parse(text, filename=path)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _add_function(file, node, "")
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    _add_function(file, item, f"{node.name}.")
    return file


def _add_function(file: SourceFile, node: ast.FunctionDef, prefix: str) -> None:
    normalised = normalise(node, file.backend)
    flat = _Flattener(file)
    flat.statement(normalised, 0)
    name = prefix + normalised.name
    file.functions[name] = Function(name, prefix + node.name, node.lineno, tuple(flat.out))


def is_numpy_backward(name: str) -> bool:
    """NumPy's hand-written backward: ``backward``, ``*_backward`` (and so ``*_for_backward``)."""
    short = name.rpartition(".")[2]
    return short == "backward" or short.endswith("_backward")


# ==================================================================== the comparison
@dataclass(frozen=True)
class Difference:
    """A hunk of one function's statement diff between a pair of backends."""

    pair: str  # "jax-torch" or "numpy-torch"
    file: str  # the module file: "attention.py"
    function: str  # qualified, normalised
    left: tuple[Statement, ...]  # the other backend's statements (jax or numpy)
    right: tuple[Statement, ...]  # torch's
    left_path: str
    right_path: str

    @property
    def size(self) -> int:
        """How many differing statements it counts for: its longer side."""
        return max(len(self.left), len(self.right))

    @property
    def reasons(self) -> tuple[str, ...]:
        found = [r for s in (*self.left, *self.right) for r in s.reasons]
        return tuple(dict.fromkeys(found))

    @property
    def reason(self) -> str | None:
        return self.reasons[0] if self.reasons else None

    def rows(self) -> list[tuple[Statement | None, Statement | None]]:
        """(left, right) statement pairs, side by side: the shorter side padded with None."""
        n = self.size
        left = [*self.left, *[None] * (n - len(self.left))]
        right = [*self.right, *[None] * (n - len(self.right))]
        return list(zip(left, right, strict=True))


@dataclass(repr=False)
class Report:
    root: str
    files: list[str]  # module files present in all three packages
    differences: list[Difference] = field(default_factory=list)
    # NumPy's backward, not compared: file -> qualified names
    numpy_backward: dict[str, list[str]] = field(default_factory=dict)
    # (path, line, reason id) of markers naming no reason in REASONS
    unknown_markers: list[tuple[str, int, str]] = field(default_factory=list)
    # (path, line, reason id) of markers on no differing statement (stale)
    unused_markers: list[tuple[str, int, str]] = field(default_factory=list)

    def __repr__(self) -> str:
        counts = ", ".join(f"{pair}: {self.count(pair)}" for pair in PAIRS)
        return f"<mirror report of {self.root}: {counts} differing statements>"

    def of(self, pair: str, file: str | None = None) -> list[Difference]:
        return [d for d in self.differences if d.pair == pair and (file is None or d.file == file)]

    def count(self, pair: str, file: str | None = None, explained: bool | None = None) -> int:
        """Differing statements of a pair (in one file); only those with (without) a reason."""
        return sum(d.size for d in self.of(pair, file) if explained is None or (d.reason is not None) == explained)

    def unexplained(self, pair: str | None = None) -> list[Difference]:
        return [d for d in self.differences if d.reason is None and (pair is None or d.pair == pair)]

    def reasons_used(self) -> set[str]:
        used = {r for d in self.differences for r in d.reasons if r in REASONS}
        files = set(PER_BACKEND_FILES.values()) | set(ONE_BACKEND_FILES.values())
        return used | ({NUMPY_BACKWARD} if self.numpy_backward else set()) | files

    def counts(self) -> dict:
        """pair -> {"total", "explained", "files": {file: {"total", "unexplained"}}}: the JSON summary."""
        return {
            pair: {
                "total": self.count(pair),
                "explained": self.count(pair, explained=True),
                "files": {
                    f: {"total": self.count(pair, f), "unexplained": self.count(pair, f, explained=False)}
                    for f in self.files
                },
            }
            for pair in PAIRS
        }

    def to_json(self) -> dict:
        def statement(s: Statement | None) -> dict | None:
            return None if s is None else {"line": s.line, "source": s.source}

        return {
            "root": self.root,
            "pairs": self.counts(),
            "numpy_backward": self.numpy_backward,
            "differences": [
                {
                    "pair": d.pair,
                    "file": d.file,
                    "function": d.function,
                    "size": d.size,
                    "reasons": list(d.reasons),
                    "left": {"path": d.left_path, "statements": [statement(s) for s in d.left]},
                    "right": {"path": d.right_path, "statements": [statement(s) for s in d.right]},
                }
                for d in self.differences
            ],
            "unknown_markers": [list(m) for m in self.unknown_markers],
            "unused_markers": [list(m) for m in self.unused_markers],
        }


def module_files(root: pathlib.Path) -> list[str]:
    """The module files present in all three packages, sorted."""
    names = [{p.name for p in (root / package).glob("*.py")} for package in PACKAGES.values()]
    return sorted(set.intersection(*names) - set(PER_BACKEND_FILES))


def _hunks(left: Function | None, right: Function | None) -> list[tuple[tuple, tuple]]:
    if left is None or right is None:
        return [((left.statements if left else ()), (right.statements if right else ()))]
    a, b = [s.text for s in left.statements], [s.text for s in right.statements]
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [
        (left.statements[i1:i2], right.statements[j1:j2])
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def _one_sided(statements: tuple[Statement, ...], function: Function) -> tuple[Statement, ...]:
    """A function with no counterpart: the marker on its ``def`` line explains each statement."""
    whole = function.reasons
    return tuple(Statement(s.text, s.line, s.end, s.source, s.reasons or whole, s.first) for s in statements)


def compare_file(files: dict[str, SourceFile], pair: str, file: str) -> list[Difference]:
    other, torch_side = PAIRS[pair]
    left_file, right_file = files[other], files[torch_side]
    names = list(dict.fromkeys([*left_file.functions, *right_file.functions]))
    differences = []
    for name in names:
        left, right = left_file.functions.get(name), right_file.functions.get(name)
        if other == "numpy" and right is None and is_numpy_backward(name):
            continue  # listed as NumPy's backward
        for left_part, right_part in _hunks(left, right):
            if left is None or right is None:
                one = left or right
                left_part, right_part = (
                    _one_sided(left_part, one) if left else (),
                    _one_sided(right_part, one) if right else (),
                )
            differences.append(Difference(pair, file, name, left_part, right_part, left_file.path, right_file.path))
    return differences


def mirror_report(root: pathlib.Path | str = ROOT, pairs: Iterable[str] = tuple(PAIRS)) -> Report:
    """The report for the source tree under ``root`` (a checkout of this repository)."""
    root = pathlib.Path(root)
    report = Report(str(root), module_files(root))
    sources = []
    for file in report.files:
        files = {backend: read_source(root, backend, file) for backend in PACKAGES}
        sources.extend(files.values())
        for pair in pairs:
            report.differences.extend(compare_file(files, pair, file))
        backward = [n for n in files["numpy"].functions if is_numpy_backward(n) and n not in files["torch"].functions]
        if backward:
            report.numpy_backward[file] = backward
    explained_lines = {
        (path, s.line, r)
        for d in report.differences
        for path, side in ((d.left_path, d.left), (d.right_path, d.right))
        for s in side
        for r in s.reasons
    }
    for source in sources:
        for line, ids in sorted(source.markers.items()):
            for reason in ids:
                if reason not in REASONS:
                    report.unknown_markers.append((source.path, line, reason))
                elif not _marks_a_difference(source, line, reason, explained_lines):
                    report.unused_markers.append((source.path, line, reason))
    return report


def _marks_a_difference(source: SourceFile, line: int, reason: str, explained: set) -> bool:
    """Whether the marker at ``line`` sits on a statement of some difference."""
    for function in source.functions.values():
        for s in function.statements:
            if s.first <= line <= s.end and (source.path, s.line, reason) in explained:
                return True
    return False
