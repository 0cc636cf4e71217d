"""The forwards hold the math: what a learner reads first is the model, not the machinery around it."""

from __future__ import annotations

import ast
import pathlib

import pytest

from transformer_backends.names import BACKENDS, package
from transformer_mirror.shape_comments import COMPONENT_FILES

ROOT = pathlib.Path(__file__).resolve().parents[2]
FORWARDS = ("forward", "__call__")
ATTENTION_FORWARD_AT_MOST_LINES = 12


def _forwards(backend: str):
    """(file, class, the forward's FunctionDef) for every module of the backend's model files."""
    for name in COMPONENT_FILES:
        path = ROOT / package(backend) / name
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name in FORWARDS:
                        yield name, node.name, item


def _body_lines(source: str, function: ast.FunctionDef) -> list[str]:
    """The function's body without its docstring: every non-blank line, comments included."""
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    lines = source.splitlines()[body[0].lineno - 1 : function.end_lineno]
    return [line for line in lines if line.strip()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_decorator_but_the_marked_kernel_switch_wraps_a_forward(backend):
    """A forward runs on what its caller passed: inputs are checked in its first lines, not by a
    decorator that calls it again with other objects. The one decorator allowed is the marked
    ``@fusable(name)`` line, where a fused kernel may take the call."""
    wrapped = [
        f"{name}: {cls}.{function.name} is decorated with {ast.unparse(decorator)}"
        for name, cls, function in _forwards(backend)
        for decorator in function.decorator_list
        if not (isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "fusable")
    ]
    assert not wrapped, wrapped


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_head_attentions_forward_fits_in_twelve_lines(backend):
    path = ROOT / package(backend) / "attention.py"
    source = path.read_text(encoding="utf-8")
    (function,) = [f for name, cls, f in _forwards(backend) if name == "attention.py" and cls == "MultiHeadAttention"]
    lines = _body_lines(source, function)
    assert len(lines) <= ATTENTION_FORWARD_AT_MOST_LINES, "\n".join(lines)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_module_with_inputs_to_check_checks_them_in_the_first_line_of_its_forward(backend):
    """A module that has a ``check_inputs`` calls it first, visibly, in its forward."""
    late = []
    for name in COMPONENT_FILES:
        tree = ast.parse((ROOT / package(backend) / name).read_text(encoding="utf-8"))
        for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
            methods = {item.name: item for item in cls.body if isinstance(item, ast.FunctionDef)}
            forward = methods.get("forward") or methods.get("__call__")
            if "check_inputs" not in methods or forward is None:
                continue
            first = forward.body[0]
            docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            body = forward.body[1:] if docstring else forward.body
            if "self.check_inputs(" not in ast.unparse(body[0]):
                late.append(f"{name}: {cls.name}")
    assert not late, f"forwards whose first statement is not self.check_inputs(...): {late}"
