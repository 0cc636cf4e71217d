"""Fixtures: ``backend`` (each installed backend, or those named with --backend) and ``reference``.

JAX's float64 switch must be set before any JAX array exists, so it is set here, at
collection time, whenever JAX is installed.

Under pytest-xdist (``pytest -n 2``, as nox runs the suite) each worker is one process on one
core: its BLAS, torch and XLA thread pools are set to one thread before any framework is
imported (two workers with a pool of two threads each fight over two cores), and the records
of the worst errors (``tolerances.py``) travel from the workers to the controller, which
prints them and writes ``--parity-json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shlex
import sys

if os.environ.get("PYTEST_XDIST_WORKER"):  # set by xdist before the worker reads this file
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    ).strip()

import pytest

from backend_adapters import get_backend
from transformer_spec import BACKENDS

from . import tolerances

if importlib.util.find_spec("jax") is not None:
    import jax

    jax.config.update("jax_enable_x64", True)


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="run the suite for this backend only (repeatable); default: every installed backend",
    )
    parser.addoption(
        "--parity-json",
        metavar="PATH",
        help="write every test's worst measured error per check and dtype to PATH (read by python -m docs.build)",
    )


def pytest_generate_tests(metafunc):
    if "backend_name" in metafunc.fixturenames:
        names = metafunc.config.getoption("--backend") or list(BACKENDS)
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


@pytest.fixture(autouse=True)
def _record_backend(request):
    """Tell the tolerance table which backend the current test holds to the reference."""
    params = getattr(request.node, "callspec", None)
    tolerances.current_backend["name"] = params.params.get("backend_name", "-") if params else "-"
    tolerances.current_backend["test"] = request.node.name
    tolerances.current_backend["nodeid"] = request.node.nodeid
    tolerances.current_backend["oracle"] = getattr(request.module, "ORACLE", "numpy float64")


_RECORDS = ("WORST", "PARITY", "GRADIENT_WORST", "CURVE_WORST")  # tolerances' dicts, keyed by tuples


def _merge_records(records: dict) -> None:
    """Fold one xdist worker's records into this process's: the worst error wins, counts add up."""
    for (backend, oracle, dtype), (error, where) in records["WORST"]:
        key = (backend, oracle, dtype)
        if error > tolerances.WORST.get(key, (-1.0, ""))[0]:
            tolerances.WORST[key] = (error, where)
    for key, (error, where) in records["GRADIENT_WORST"]:
        key = tuple(key)
        if error > tolerances.GRADIENT_WORST.get(key, (-1.0, ""))[0]:
            tolerances.GRADIENT_WORST[key] = (error, where)
    for key, error in records["CURVE_WORST"]:
        key = tuple(key)
        tolerances.CURVE_WORST[key] = max(error, tolerances.CURVE_WORST.get(key, 0.0))
    for key, (error, count, tolerance, backend, oracle) in records["PARITY"]:
        entry = tolerances.PARITY.setdefault(tuple(key), [0.0, 0, tolerance, backend, oracle])
        entry[0], entry[1] = max(entry[0], error), entry[1] + count


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist installed it is never called
def pytest_testnodedown(node, error):
    """xdist's controller: a worker finished; take its records."""
    records = getattr(node, "workeroutput", {}).get("tolerances")
    if records:
        _merge_records(json.loads(records))


def pytest_terminal_summary(terminalreporter):
    if tolerances.GRADIENT_WORST:
        terminalreporter.section("worst gradient error per backend (see GRADIENT_TOLERANCE)")
        for (backend, check), (error, where) in sorted(tolerances.GRADIENT_WORST.items()):
            terminalreporter.write_line(f"{backend:<6} {check:<20} {error:.2e}  at {where}")
    if tolerances.CURVE_WORST:
        terminalreporter.section("float64 loss curves vs the NumPy reference: max relative difference per step")
        for (backend, run), error in sorted(tolerances.CURVE_WORST.items()):
            terminalreporter.write_line(f"{backend:<6} {run:<22} {error:.2e}")
    if not tolerances.WORST:
        return
    terminalreporter.section("worst measured difference / max |reference|, per backend, reference and dtype")
    for (backend, oracle, dtype), (error, where) in sorted(tolerances.WORST.items()):
        tol = tolerances.TOLERANCE[dtype]
        terminalreporter.write_line(
            f"{backend:<6} vs {oracle:<22} {dtype:<8} {error:.2e} (tolerance {tol:.0e})  at {where}"
        )


def pytest_sessionfinish(session):
    """With --parity-json PATH: every test's worst error per check and dtype, sorted (a stable file).
    An xdist worker hands its records to the controller instead (``pytest_testnodedown``)."""
    if hasattr(session.config, "workeroutput"):
        records = {name: [[list(k), v] for k, v in getattr(tolerances, name).items()] for name in _RECORDS}
        session.config.workeroutput["tolerances"] = json.dumps(records)
        return
    path = session.config.getoption("--parity-json")
    if not path:
        return
    versions = {"python": platform.python_version()}
    for name in ("numpy", "jax", "flax", "torch"):
        if name in sys.modules:
            versions[name] = getattr(sys.modules[name], "__version__", "?")
    tests = [
        {"test": test, "check": check, "dtype": dtype, "backend": backend, "reference": oracle,
         "worst": worst, "comparisons": count, "tolerance": tolerance}
        for (test, check, dtype), (worst, count, tolerance, backend, oracle) in sorted(tolerances.PARITY.items())
    ]  # fmt: skip
    command = shlex.join(["pytest", *session.config.invocation_params.args])
    with open(path, "w", encoding="utf-8") as f:  # one test per line: a readable diff when remeasured
        f.write(f'{{\n "command": {json.dumps(command)},\n "versions": {json.dumps(versions, sort_keys=True)},\n')
        f.write(' "tests": [\n' + ",\n".join("  " + json.dumps(t, sort_keys=True) for t in tests) + "\n ]\n}\n")
