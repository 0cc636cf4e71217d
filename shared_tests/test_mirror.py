"""The three backends mirror each other: same files, same public names, same argument names.

A learner diffs ``numpy_impl/attention.py`` against ``torch_impl/attention.py``; these
tests keep that diff a translation.
"""

from __future__ import annotations

import inspect
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def module_files(package: str) -> set[str]:
    return {p.name for p in (ROOT / package).glob("*.py")}


def call_signature(obj) -> list[str]:
    """Argument names of a function, or of a class's constructor and its forward/__call__."""
    if inspect.isclass(obj):
        call = obj.__dict__.get("forward") or obj.__dict__.get("__call__")
        parts = [_names(obj.__init__)]
        if call is not None:
            parts.append(_names(call))
        return parts
    return [_names(obj)]


# Trailing arguments a framework demands and the others lack (torch allocates on a device).
FRAMEWORK_ONLY = {"device"}


def _names(fn) -> list[str]:
    skip = {"self", "cls", "rngs"} | FRAMEWORK_ONLY
    return [p.name for p in inspect.signature(fn).parameters.values() if p.name not in skip]


@pytest.mark.parametrize("package", ["jax_impl", "torch_impl"])
def test_backends_have_the_same_module_files(package):
    assert module_files(package) == module_files("numpy_impl")


def test_backends_export_the_same_public_names(backend, reference):
    assert sorted(backend.impl.__all__) == sorted(reference.impl.__all__)


def test_public_functions_and_classes_take_the_same_arguments(backend, reference):
    different = {}
    for name in reference.impl.__all__:
        ours, theirs = getattr(reference.impl, name), getattr(backend.impl, name)
        if callable(ours) and not isinstance(ours, dict):
            mine, other = call_signature(ours), call_signature(theirs)
            # numpy writes Linear as a class; torch and Flax bring their own, built by a function
            # with the same arguments: compare what both have.
            if mine[: len(other)] != other[: len(mine)]:
                different[name] = (mine, other)
    assert not different, f"signatures differ from numpy_impl: {different}"
