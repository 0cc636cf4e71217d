"""Shape comments: which lines of the model code compute an array, and which of them do not say its shape.

The house style: every tensor-valued line in the model code carries its shape, as a comment
(``# (B, H, T_q, T_k)``). This module decides, from the source alone (``ast`` and
``tokenize``, nothing imported), which statements are *tensor lines* and whether each
carries a shape. ``shared_tests/repository/test_mirror.py`` holds all three backends to it.

A **tensor line** is a statement inside a function or method of a model component file
(``COMPONENT_FILES``), constructors (``__init__``) aside (the parameters' shapes are
``transformer_spec.param_schema``'s), that assigns (``=``, ``+=``, annotated) or returns a
value that *computes an array*. A value computes an array when it

1. multiplies matrices (``@``); or
2. calls the framework (``np.``, ``jnp.``, ``torch.``, ``F.``, ``jax.``, ``special.``), an
   array method (``ARRAY_METHODS``: ``.reshape``, ``.transpose``, ``.mean``, ...), or a
   submodule or method of the module (``self.w_q(x)``, ``self.norm.backward(...)``); or
3. computes with an *array name* -- arithmetic, comparison, indexing, or an argument of a
   call -- where the array names of a function are its parameters annotated as arrays
   (``np.ndarray``, ``jax.Array``, ``torch.Tensor``, with ``| None`` too) and every name
   assigned by an earlier tensor line of the same function.

Uses of an array through ``.shape``, ``.dtype``, ``.ndim``, ``.device`` or ``len()`` do not
count, and a value that only passes along what earlier lines computed is no tensor line:
names, attributes, constants, ``None``, lambdas, comprehensions (a Python list, not an
array), dicts of named values (``with_prefix(...)``, merged with ``|``), and tuples, lists,
dicts, conditional expressions and container classes (``KeyValueCache(k, v)``,
``tuple(...)``) of those. Nor are Python scalars: nothing inside ``int()``, ``float()``,
``bool()``, ``len()``, ``any()``, ``all()`` or ``isinstance()`` counts, nor ``math.``
functions, nor a module's ``train()``/``eval()``.
``record(...)``, the checks and other bare calls assign nothing and are not tensor lines.

A tensor line **carries its shape** when a comment on one of its lines, or a comment line
directly above it, holds a parenthesised shape: comma-separated dimensions, each a name, a
number, ``...`` or an expression of them (``B|1``, ``position + T_new``, ``ceil(d/2)``):
``(B, T, d_model)``, ``(..., T_q, 1)``, ``(d_model,)``, ``(...)`` or ``()`` (a scalar).
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize
from dataclasses import dataclass

from transformer_backends import names as backends

# The model, in the README's reading order, and its building blocks: not the training,
# decoding, tracing, weight-loading and validation glue around it.
COMPONENT_FILES = (
    "masks.py",
    "positional.py",
    "embeddings.py",
    "attention.py",
    "tiled_attention.py",
    "feed_forward.py",
    "layer_norm.py",
    "sublayer.py",
    "encoder.py",
    "decoder.py",
    "model.py",
    "loss.py",
    "layers.py",
)
PACKAGES = tuple(backends.package(name) for name in backends.BACKENDS)  # numpy_impl, jax_impl, torch_impl

FRAMEWORK_ROOTS = {"np", "jnp", "torch", "F", "jax", "special"}
# builtins that give a Python scalar or a bool, whatever their arguments: not looked into
SCALAR_BUILTINS = {"len", "isinstance", "hasattr", "int", "float", "bool", "str", "any", "all"}
# methods of a module that return the module or its parts, not an array
MODULE_METHODS = {"train", "eval", "parameters", "named_modules", "modules", "children"}
# functions that build a dict of named values (gradients), not an array
DICT_BUILDERS = {"with_prefix"}
ARRAY_METHODS = {
    "reshape", "transpose", "swapaxes", "permute", "view", "astype", "to", "copy", "clone", "detach",
    "sum", "mean", "max", "min", "amax", "amin", "any", "all", "prod", "std", "var", "argmax", "argmin",
    "exp", "log", "sqrt", "tanh", "clip", "clamp", "masked_fill", "where", "at", "cumsum", "matmul",
    "float", "double", "long", "numpy", "cpu", "contiguous", "unsqueeze", "squeeze", "flatten",
}  # fmt: skip
SHAPE_READS = {"shape", "dtype", "ndim", "device", "training", "config"}
ARRAY_TYPES = re.compile(r"\b(ndarray|Array|Tensor)\b")

_ATOM = r"(?:\.\.\.|[A-Za-z_]\w*(?:\([^()]*\))?|\d+)"
_DIM = rf"{_ATOM}(?:\s*[-+*/|]\s*{_ATOM})*"
SHAPE = re.compile(rf"\((?:\s*|\s*\.\.\.\s*|\s*{_DIM}\s*,(?:\s*{_DIM}\s*,)*(?:\s*{_DIM})?\s*)\)")


@dataclass(frozen=True)
class TensorLine:
    path: str  # relative to the root: "torch_impl/encoder.py"
    line: int  # its first line
    function: str  # qualified: "EncoderLayer.forward"
    source: str  # its first line, stripped
    has_shape: bool


def has_shape(comment: str) -> bool:
    """Whether a comment holds a parenthesised shape such as ``(B, T, d_model)``."""
    return SHAPE.search(comment) is not None


def tensor_lines(root: pathlib.Path, path: str) -> list[TensorLine]:
    """Every tensor line of the file ``root / path``, with whether it carries its shape."""
    text = (root / path).read_text(encoding="utf-8")
    lines = text.splitlines()
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = comments.get(token.start[0], "") + token.string
    found = []
    for qualified, function in _functions(ast.parse(text, filename=path)):
        if function.name == "__init__":
            continue
        for node in _TensorStatements(function).found:
            numbers = range(node.lineno, node.end_lineno + 1)
            above = node.lineno - 1
            notes = [comments.get(n, "") for n in numbers]
            if above >= 1 and lines[above - 1].strip().startswith("#"):
                notes.append(comments.get(above, ""))
            shaped = any(has_shape(note) for note in notes)
            found.append(TensorLine(path, node.lineno, qualified, lines[node.lineno - 1].strip(), shaped))
    return found


def missing_shape_comments(root: pathlib.Path, packages=PACKAGES, files=COMPONENT_FILES) -> list[TensorLine]:
    """The tensor lines of the model component files that do not say their shape."""
    missing = []
    for package in packages:
        for file in files:
            if (root / package / file).exists():
                missing += [t for t in tensor_lines(root, f"{package}/{file}") if not t.has_shape]
    return missing


def _functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{node.name}.{item.name}", item


class _TensorStatements:
    """The tensor lines of one function, in order (nested functions included, with their own parameters)."""

    def __init__(self, function: ast.FunctionDef):
        self.arrays: set[str] = set()
        self.found: list[ast.stmt] = []
        self.function(function)

    def function(self, node: ast.FunctionDef) -> None:
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if arg.annotation is not None and _is_array_type(arg.annotation):
                self.arrays.add(arg.arg)
        self.body(node.body)

    def body(self, statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.FunctionDef):
                self.function(node)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)):
                if node.value is not None and self.computes_array(node.value):
                    self.found.append(node)
                    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                    for target in filter(None, targets):
                        self.arrays |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    self.body(getattr(node, field, []) or [])

    def computes_array(self, value: ast.expr) -> bool:
        if _passes_along(value):
            return False
        return any(self.is_array_operation(node) for node in _uses(value))

    def is_array_operation(self, node: ast.AST) -> bool:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return True
        if isinstance(node, ast.Call):
            func = node.func
            root = _root(func)
            if root in FRAMEWORK_ROOTS:
                return True
            if isinstance(func, ast.Attribute) and root != "math" and func.attr not in MODULE_METHODS:
                return func.attr in ARRAY_METHODS or root == "self"
        return isinstance(node, ast.Name) and node.id in self.arrays and isinstance(node.ctx, ast.Load)


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _uses(value: ast.expr):
    """The nodes of ``value``, except what hangs off a shape read (``x.shape[1]``, ``len(x)``) or a lambda."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Attribute) and node.attr in SHAPE_READS:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SCALAR_BUILTINS:
            continue
        if isinstance(node, ast.Lambda):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _passes_along(value: ast.expr) -> bool:
    """A value that computes nothing new: names, attributes, constants and containers of them."""
    if isinstance(value, (ast.Name, ast.Constant, ast.Lambda, ast.ListComp, ast.DictComp, ast.GeneratorExp)):
        return True  # (a comprehension builds a Python list or dict, even of arrays)
    if isinstance(value, ast.Attribute):
        return _passes_along(value.value)
    if isinstance(value, (ast.Tuple, ast.List)):
        return all(_passes_along(e) for e in value.elts)
    if isinstance(value, ast.Starred):
        return _passes_along(value.value)
    if isinstance(value, ast.Dict):
        return all(_passes_along(v) for v in value.values)
    if isinstance(value, ast.IfExp):
        return _passes_along(value.body) and _passes_along(value.orelse)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):  # dicts merged: grads | with_prefix(...)
        sides = (value.left, value.right)
        return all(_passes_along(v) for v in sides) and any(_builds_dict(v) for v in sides)
    if _builds_dict(value):
        return True
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        container = value.func.id in ("tuple", "list", "dict") or value.func.id[:1].isupper()
        arguments = [*value.args, *(k.value for k in value.keywords)]
        return container and all(_passes_along(a) for a in arguments)
    return False


def _builds_dict(value: ast.expr) -> bool:
    if isinstance(value, ast.Dict):
        return True
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):
        return _passes_along(value)
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in DICT_BUILDERS


def _is_array_type(annotation: ast.expr) -> bool:
    """``np.ndarray``, ``jax.Array``, ``torch.Tensor``, or one of them ``| None``."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [
            s for s in (annotation.left, annotation.right) if not (isinstance(s, ast.Constant) and s.value is None)
        ]
        return bool(sides) and all(_is_array_type(s) for s in sides)
    name = annotation.attr if isinstance(annotation, ast.Attribute) else getattr(annotation, "id", "")
    return ARRAY_TYPES.fullmatch(name) is not None
