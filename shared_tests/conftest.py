"""Fixtures: ``backend`` (each installed backend, or those named with --backend) and ``reference``.

JAX's float64 switch must be set before any JAX array exists, so it is set here, at
collection time, whenever JAX is installed.
"""

from __future__ import annotations

import importlib.util

import pytest

from transformer_cli.backends import NAMES, get_backend

if importlib.util.find_spec("jax") is not None:
    import jax

    jax.config.update("jax_enable_x64", True)


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        action="append",
        choices=NAMES,
        help="run the suite for this backend only (repeatable); default: every installed backend",
    )


def pytest_generate_tests(metafunc):
    if "backend_name" in metafunc.fixturenames:
        names = metafunc.config.getoption("--backend") or list(NAMES)
        metafunc.parametrize("backend_name", names, scope="session")


@pytest.fixture(scope="session")
def backend(backend_name):
    try:
        return get_backend(backend_name)
    except ImportError as error:
        pytest.skip(f"backend {backend_name!r} is not installed ({error.name}); install the [{backend_name}] extra")


@pytest.fixture(scope="session")
def reference():
    """The NumPy backend, run in float64: every other result is held to it."""
    return get_backend("numpy")
