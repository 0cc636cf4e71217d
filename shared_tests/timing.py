"""Where the suite's time goes: ``pytest --timing-json PATH`` writes, for every test, its setup, call
and teardown seconds, the CPU seconds its process and the processes it waited for spent, and for
JAX how much of it was tracing, lowering and XLA compiling (against running), and how many programs
came back from the run's persistent compilation cache (compiled before, in this or another worker)
instead of being compiled again. Each process also records what it paid before its first test
(the interpreter, the imports, collecting). ``python -m tools.suite_time`` turns the files into the
tables of docs/test-time.md.

The hooks live here and conftest.py imports them (a conftest's hooks are what pytest reads); under
xdist each worker hands its records to the controller, as the tolerance records travel.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import pytest

_STARTED = {"wall": time.monotonic(), "cpu": time.process_time()}  # when conftest.py was first imported
# Each JAX duration event, by the name the table uses.
_JAX_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "jax_trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "jax_lower_s",
    "/jax/core/compile/backend_compile_duration": "jax_compile_s",  # XLA, or reading the persistent cache
    "/jax/compilation_cache/cache_retrieval_time_sec": "jax_cache_read_s",
}
_JAX_COUNTS = {"/jax/compilation_cache/cache_hits": "jax_cache_hits",
               "/jax/compilation_cache/cache_misses": "jax_cache_misses"}  # fmt: skip

_KEY = pytest.StashKey[dict]()  # a test's record, on its item
_current: dict[str, float] = {}  # the running test's JAX figures
_tests: list[dict] = []
_process: dict[str, float] = {}


def _cpu() -> float:
    """CPU seconds of this process and of the child processes it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _on_duration(event: str, duration: float, **_) -> None:
    name = _JAX_EVENTS.get(event)
    if name:
        _current[name] = _current.get(name, 0.0) + duration


def _on_event(event: str, **_) -> None:
    name = _JAX_COUNTS.get(event)
    if name:
        _current[name] = _current.get(name, 0) + 1


def pytest_addoption(parser):
    parser.addoption("--timing-json", metavar="PATH",
                     help="write every test's setup, call and teardown seconds, its CPU, and JAX's tracing and "
                          "compiling apart from running, to PATH (python -m tools.suite_time reads it)")  # fmt: skip


def pytest_configure(config):
    if not config.getoption("--timing-json") or "jax" not in sys.modules:
        return
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(_on_duration)
    monitoring.register_event_listener(_on_event)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not item.config.getoption("--timing-json"):
        yield
        return
    if not _process:  # this process's first test: what came before it
        _process.update(startup_wall_s=time.monotonic() - _STARTED["wall"], startup_cpu_s=_cpu())
    _current.clear()
    record = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "cpu_s": -_cpu()}
    item.stash[_KEY] = record
    yield
    record["cpu_s"] += _cpu()
    record.update({k: round(v, 4) if isinstance(v, float) else v for k, v in _current.items()})
    record["cpu_s"] = round(record["cpu_s"], 3)
    _tests.append(record)



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    record = item.stash.get(_KEY, None)
    if record is not None:
        record[f"{call.when}_s"] = round(call.duration, 4)
        if call.when == "call" or call.excinfo is not None:
            record["outcome"] = outcome.get_result().outcome


def timing_records() -> dict:
    """This process's records (a worker sends them to the controller)."""
    return {"process": {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), **_process,
                        "end_wall_s": time.monotonic() - _STARTED["wall"], "end_cpu_s": _cpu()},
            "tests": _tests}  # fmt: skip


def write_timing(path: str, runs: list[dict], wall_s: float) -> None:
    """The controller's file: every process's records, and the run's wall time."""
    payload = {"command": " ".join(sys.argv), "wall_s": round(wall_s, 2), "cpus": os.cpu_count(),
               "processes": [r["process"] for r in runs], "tests": [t for r in runs for t in r["tests"]]}  # fmt: skip
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f)
