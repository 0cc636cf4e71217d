"""The processes the sharded runs need (JAX's children on simulated devices, JAX's two processes on
one mesh, torch's groups of gloo ranks, torch's ranks on two simulated torchrun nodes), each set
started once per test run, by the first test that needs it.

Under xdist each worker is its own process: the first to need a set of processes starts it (a file
created exclusively in the run's shared folder says who did) and records how each process ended;
the other workers wait for that record."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

import pytest

from .cases import CONFIGS
from .parent import WITH_PARENT, die_with_parent

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 600  # seconds, for a whole set
JAX_DEVICES = 4  # simulated CPU devices in each of JAX's children
TORCH_NODES, TORCH_RANKS = 2, 2  # test_torch_nodes.py's simulated nodes, and torch ranks on each


class Processes:
    """A set of processes started once per run: ``commands`` {label: argv} with ``env``. The worker
    that starts them records how they ended from a thread, whichever worker's tests read them."""

    def __init__(self, folder: pathlib.Path, name: str, commands: Mapping[str, list[str]], env: dict[str, str]):
        self.name, self.folder, self.record = name, folder, folder / f"{name}.ended.json"
        self.processes, self.recorder = {}, None
        # a fault planned by a test of this worker (test_lost_rank.py's, in its environment) is not theirs
        env = {k: v for k, v in env.items() if k != "TRANSFORMER_REF_FAULT"}
        self.starter, self.ended = os.getpid(), None
        try:
            started = os.open(folder / f"{name}.started", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # another worker runs them: which one
            self.starter = self._starter(folder / f"{name}.started")
            return
        os.write(started, str(self.starter).encode())
        os.close(started)
        for label, command in commands.items():  # each killed if this worker dies (nobody would read it)
            self.processes[label] = subprocess.Popen([*WITH_PARENT, *command], cwd=ROOT, env=env,
                                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.recorder = threading.Thread(target=self._record, daemon=True)
        self.recorder.start()

    def _record(self) -> None:
        ended, deadline = {}, time.monotonic() + TIMEOUT
        for label, process in self.processes.items():
            try:
                stdout, stderr = process.communicate(timeout=max(deadline - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
            ended[label] = {"returncode": process.returncode, "stdout": stdout[-5000:], "stderr": stderr[-20000:]}
        partial = self.record.with_suffix(".partial")
        partial.write_text(json.dumps(ended))
        partial.replace(self.record)  # whole, at once: another worker may be reading

    @staticmethod
    def _starter(path: pathlib.Path) -> int | None:
        """The pid of the worker that started a set (written just after the file was made)."""
        for _ in range(100):
            text = path.read_text()
            if text:
                return int(text)
            time.sleep(0.05)
        return None

    def wait(self) -> dict[str, dict]:
        """-> {label: {"returncode", "stdout", "stderr"}} once every process has ended. If they never
        will (the worker that started them died: a crash, a kill), the answer says so at once, and
        the next test asking is told the same without waiting again."""
        if self.ended is None:
            self.ended = self._wait()
        return self.ended

    def _wait(self) -> dict[str, dict]:
        deadline = time.monotonic() + TIMEOUT + 30
        while not self.record.exists() and time.monotonic() < deadline:
            if self.starter is not None and not _alive(self.starter):
                time.sleep(1.0)  # its record may be landing
                if not self.record.exists():
                    why = f"the pytest worker that started them (pid {self.starter}) died first"
                    return {"all": {"returncode": None, "stdout": "", "stderr": why}}
            time.sleep(0.5)
        if not self.record.exists():
            return {"all": {"returncode": None, "stdout": "", "stderr": f"no record after {TIMEOUT} s"}}
        return json.loads(self.record.read_text())

    def check(self) -> None:
        """Wait; fail with the output of each process that did not exit 0."""
        failed = {label: e for label, e in self.wait().items() if e["returncode"] != 0}
        if failed:
            raise AssertionError("\n".join(
                f"{self.name} {label} exited with {e['returncode']}\n--- stdout ---\n{e['stdout']}\n"
                f"--- stderr ---\n{e['stderr']}" for label, e in failed.items()
            ))  # fmt: skip

    def stop(self) -> None:
        """At the end of the starting worker's session: let the processes end (another worker's
        tests may be waiting for them), within the timeout."""
        if self.recorder is not None:
            self.recorder.join()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rank(target, args: tuple) -> None:
    die_with_parent()
    target(*args)


def run_group(target, args_of_ranks: list[tuple]) -> list[str]:
    """A group of torch ranks, rank r running ``target(*args_of_ranks[r])``, forked from this process
    (which has imported what they run: copies of it, nothing imported again) on Linux, spawned
    elsewhere (macOS's system libraries are not safe to fork, and Windows cannot). A rank that fails
    ends its group (the others would wait for it in a collective). What failed, in words."""
    import multiprocessing

    start = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    if "torch" in sys.modules:
        # imported once here, not in every rank: a DTensor's first placement imports torch._dynamo
        # (distribute_tensor is wrapped by torch._disable_dynamo, which imports it on its first
        # call), with torch.onnx and functorch behind it: 40% of a forked rank's time, measured
        import torch._dynamo  # noqa: F401
    size = len(args_of_ranks)
    ranks = [start.Process(target=_rank, args=(target, args)) for args in args_of_ranks]
    for rank in ranks:
        rank.start()
    while any(rank.exitcode is None for rank in ranks):
        if any(rank.exitcode for rank in ranks):  # one failed: the others cannot finish
            for rank in ranks:
                rank.terminate()
        time.sleep(0.1)
    return [f"group of {size}: rank {r} exited with {rank.exitcode}" for r, rank in enumerate(ranks) if rank.exitcode]


def jax_children(folder: pathlib.Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """test_jax_sharding.py's children, one per model of CONFIGS, side by side, on 4 simulated CPU
    devices each."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # no persistent compilation cache: no other process compiles these programs, and writing each
    # one to it took 12% of a child's time
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    # 4 CPU devices; XLA's light code generation comes with the run's XLA_FLAGS (conftest.py): compiling
    # is nearly all of the children's time
    flag = f"--xla_force_host_platform_device_count={JAX_DEVICES}"
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
    module = "shared_tests.sharding.test_jax_sharding"
    return {part: [sys.executable, "-m", module, "child", str(folder), part] for part in CONFIGS}, env


def jax_processes(folder: pathlib.Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """test_jax_processes.py's launcher, which spawns the run's processes (jax.distributed, 2 CPU
    devices each: it sets them itself, so no device count in XLA_FLAGS)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # as for jax_children: no other process compiles these
    return {"launcher": [sys.executable, "-m", "shared_tests.sharding.test_jax_processes", str(folder)]}, env


def torch_groups(folder: pathlib.Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """test_torch_sharding.py's launcher, which forks each group's ranks from itself."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return {"launcher": [sys.executable, "-m", "shared_tests.sharding.test_torch_sharding", str(folder)]}, env


def torch_checkpoints(folder: pathlib.Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """test_torch_checkpoints.py's launcher, which forks each group's ranks from itself."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return {"launcher": [sys.executable, "-m", "shared_tests.sharding.test_torch_checkpoints", str(folder)]}, env


def lost_rank(framework: str):
    """test_lost_rank.py's two jobs of ``framework`` (torchrun's ranks, or JAX's 2 processes),
    run one after another by ``python -m shared_tests.sharding.test_lost_rank FOLDER FRAMEWORK``."""

    def commands(folder: pathlib.Path) -> tuple[dict[str, list[str]], dict[str, str]]:
        # The run's persistent compilation cache kept: a restarted job compiles what the job before
        # it compiled (JAX writes a program to it from process 0 only, so process 0 reads it back)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        module = "shared_tests.sharding.test_lost_rank"
        return {framework: [sys.executable, "-m", module, str(folder), framework]}, env

    return commands


def jax_save_memory(folder: pathlib.Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """test_jax_checkpoints.py's launcher of 4 jax.distributed processes of one CPU device each, with
    one malloc arena: the resident peak they read is then what the save holds, not what glibc keeps
    in each writer thread's own arena after it is freed (3-14 MB more on this model, measured; torch's
    and NumPy's measures count live tensors and Python's allocations, so no allocator's slack either)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="1")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # as jax_children: no other process compiles these
    return {"launcher": [sys.executable, "-m", "shared_tests.sharding.test_jax_checkpoints", str(folder)]}, env


def torch_nodes(folder: pathlib.Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """test_torch_nodes.py's two simulated nodes: a torchrun each (``python -m torch.distributed.run``,
    this interpreter's), TORCH_NODES x TORCH_RANKS ranks meeting at one c10d rendezvous endpoint on
    this machine, at a port free now."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    # a node that never comes fails the other after 120 s (join_timeout), not torchrun's 600
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(TORCH_NODES),
                "--nproc-per-node", str(TORCH_RANKS), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", f"torch-nodes-{port}",
                "--rdzv-conf", "join_timeout=120"]  # fmt: skip
    module = ["-m", "shared_tests.sharding.test_torch_nodes", str(folder)]
    return {f"node-{node}": [*torchrun, *module] for node in range(TORCH_NODES)}, env


def random_plans(framework: str):
    """test_random_plans.py's process for ``framework``: JAX's child on 8 simulated CPU devices (its
    plans have up to 8), or torch's launcher, which forks each group's ranks from itself."""

    def commands(folder: pathlib.Path) -> tuple[dict[str, list[str]], dict[str, str]]:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if framework == "jax":
            env.pop("JAX_COMPILATION_CACHE_DIR", None)  # as jax_children: no other process compiles these
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
        module = "shared_tests.sharding.test_random_plans"
        return {framework: [sys.executable, "-m", module, framework, str(folder)]}, env

    return commands


def jax_results(sharded: Processes) -> tuple[dict, dict, pathlib.Path]:
    """Wait for test_jax_sharding.py's children: (their arrays, their collectives per plan, their
    folder); the output of any that failed in the failure."""
    import numpy as np

    sharded.check()
    results, collectives = {}, {}
    for part in CONFIGS:
        results |= dict(np.load(sharded.folder / f"jax-{part}.npz"))
        collectives |= json.loads((sharded.folder / f"jax-{part}.collectives.json").read_text())
    return results, collectives, sharded.folder


class SharedRuns:
    """The sets of processes of SETS, each started when a test first needs it (not all at once:
    on two cores, JAX's children and torch's ranks together took a third more CPU time than one
    set after another, their threads and ranks waiting on each other while descheduled)."""

    def __init__(self, folder: pathlib.Path):
        self.folder, self.started = folder, {}

    def available(self, name: str) -> bool:
        return importlib.util.find_spec(SETS[name][0]) is not None

    def __getitem__(self, name: str) -> Processes:
        if name not in self.started:
            _, commands = SETS[name]
            # a folder of the set's own: two sets never write (or rendezvous in) the same file
            folder = self.folder / name
            folder.mkdir(exist_ok=True)
            self.started[name] = Processes(folder, name, *commands(folder))
        return self.started[name]

    def stop(self) -> None:
        for processes in self.started.values():
            processes.stop()


SETS = {  # name: (the framework it needs, its commands)
    "jax": ("jax", jax_children),
    "jax-processes": ("jax", jax_processes),
    "jax-save-memory": ("jax", jax_save_memory),
    "torch": ("torch", torch_groups),
    "torch-nodes": ("torch", torch_nodes),
    "torch-checkpoints": ("torch", torch_checkpoints),
    "lost-rank-torch": ("torch", lost_rank("torch")),
    "lost-rank-jax": ("jax", lost_rank("jax")),
    "random-plans-jax": ("jax", random_plans("jax")),
    "random-plans-torch": ("torch", random_plans("torch")),
}


@pytest.fixture(scope="session")
def sharded_runs(tmp_path_factory) -> SharedRuns:
    """The run's sets of processes (one folder for all xdist workers), started as tests need them."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "sharded-runs"  # the run's
    folder.mkdir(exist_ok=True)
    runs = SharedRuns(folder)
    yield runs
    runs.stop()
