"""JAX across processes: the multi-controller runtime every multi-host JAX program runs on.

Each process runs the same program. ``jax.distributed.initialize`` connects it to the others
through one coordinator (a small service that process 0 starts at ``coordinator_address``; the
others dial it to learn who is who, and it watches that every process stays alive); then
``jax.devices()`` lists every process's devices, ``jax.local_devices()`` this process's own, and
one mesh spans them all. A program compiled for that mesh runs in every process at once, each on
its own devices, and its collectives cross processes: on GPUs through NCCL, on TPUs over their
interconnect, on CPUs through gloo over TCP (``jax_cpu_collectives_implementation``, "gloo" by
default in the installed JAX; it must be set before the CPU backend starts).

What changes for the code, measured on jax 0.10.2 with 2 processes of 2 CPU devices each:

- an array placed on a mesh that spans processes is global: each process holds only its own
  devices' shards (``is_fully_addressable`` is False). ``np.asarray`` of it raises ("Fetching value
  for `jax.Array` that spans non-addressable (non process local) devices is not possible"); a
  fully replicated one (``P()``) reads back locally. So results are read after making them whole
  on every device (``replicated``): every process then reads the same numbers;
- ``jax.device_put`` of a committed single-device array (a model's weights, built in this
  process) onto such a mesh raises ("device_put's second argument must be a Device or a Sharding
  which represents addressable devices"; an nnx state onto ``P()``: "The backend ... does not
  support cross-host device transfers"); of a NumPy array it works but first compares the value
  across processes (``multihost_utils.assert_equal``: one collective per array). ``place`` builds
  each global array from this process's copy instead (``jax.make_array_from_callback``: each
  process fills its own devices' shards, nothing travels), as every process holds the same whole
  weights and batch (built from the same seed);
- the way back to one device (``gather``) cannot be ``device_put`` onto ``jax.devices()[0]``:
  that is process 0's device ("the first argument must be a fully addressable array"). Each
  process takes its local copy of the replicated array (``local``);
- what reads values eagerly (the checks of the batch's token ids) reads this process's copy of
  the batch, before it is placed.

Started two ways, both ending in ``initialize``:

- ``launch``: N local processes started from this one (``transformer-ref train ... --processes
  N``), the coordinator on 127.0.0.1 at a free port; on Linux they are forked from a server
  process that imported JAX once for all of them and for every restart;
- by hand, or by a cluster's scheduler: every process started with the coordinator's address
  (host:port of process 0's machine), the number of processes and its own id, as arguments or
  in the environment (``ENVIRONMENT``). On TPU pods and under SLURM or Open MPI, JAX finds all
  three itself.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

# What a scheduler sets for each process (JAX reads JAX_COORDINATOR_ADDRESS itself; the other two
# are ours: JAX finds them itself only on the clusters it knows).
ENVIRONMENT = {
    "coordinator": "JAX_COORDINATOR_ADDRESS",  # host:port of the coordinator: process 0's machine
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",  # 0 .. num_processes - 1; process 0 runs the coordinator
}


def from_environment() -> dict[str, Any]:
    """The coordinator's address, the number of processes and this process's id, from the
    environment (``ENVIRONMENT``); those not set are None."""
    found = {name: os.environ.get(variable) or None for name, variable in ENVIRONMENT.items()}
    for name in ("num_processes", "process_id"):
        if found[name] is not None:
            try:
                found[name] = int(found[name])
            except ValueError:
                raise ValueError(
                    f"{ENVIRONMENT[name]}={found[name]!r} is not a whole number"
                ) from None
    return found


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    cpu_devices: int | None = None,
    timeout: int = 120,
) -> None:
    """``jax.distributed.initialize`` with the arguments given, else the environment's
    (``ENVIRONMENT``); before anything else has used JAX's devices. ``cpu_devices``: how many CPU
    devices this process shows (a CPU stands for a machine's accelerators; ignored where JAX
    finds GPUs or TPUs). ``timeout``: seconds to wait for every process to reach the coordinator."""
    import jax

    env = from_environment()
    coordinator = coordinator or env["coordinator"]
    num_processes = num_processes if num_processes is not None else env["num_processes"]
    process_id = process_id if process_id is not None else env["process_id"]
    given = {"coordinator": coordinator, "num_processes": num_processes, "process_id": process_id}
    missing = [ENVIRONMENT[name] for name, value in given.items() if value is None]
    if missing:
        raise ValueError(
            f"a process of a multi-process run needs {', '.join(missing)} (or the arguments)"
        )
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process id {process_id} is not one of 0 .. {num_processes - 1}")
    if cpu_devices is not None:
        jax.config.update("jax_num_cpu_devices", cpu_devices)
    # gloo is the installed JAX's default for the CPU's collectives across processes; said here
    # because without one (None) a program that spans processes fails when it runs: "Multiprocess
    # computations aren't implemented on the CPU backend"
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator, num_processes, process_id, initialization_timeout=timeout
    )


def free_port() -> int:
    """A TCP port nothing listens on now, for a local coordinator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process(
    target: Callable,
    args: tuple,
    coordinator: str,
    processes: int,
    rank: int,
    cpu_devices: int,
    restart: int = 0,
    environment: dict[str, str] | None = None,
):
    """One started process: the launcher's environment (a forked process has the fork server's,
    from when the server started), its place in the run there (a program that starts processes
    of its own, or asks, finds it), ``initialize``, then ``target(*args)``."""
    if environment is not None:
        os.environ.clear()
        os.environ.update(environment)
    place = {"coordinator": coordinator, "num_processes": str(processes), "process_id": str(rank)}
    os.environ.update({ENVIRONMENT[name]: value for name, value in place.items()})
    os.environ[RESTART_COUNT] = str(restart)
    initialize(cpu_devices=cpu_devices)
    result = target(*args)
    # The processes leave together (jax.distributed's shutdown waits for every one of them), as
    # they would at the interpreter's exit; a forked process ends without it (os._exit runs no
    # exit handler), and one that left early broke the others' collectives still running (process
    # 0 of ``transformer-ref train --processes N`` decodes with the sharded model after the others
    # are done: "Gloo AllGather failed: ... Connection reset by peer").
    import jax

    jax.distributed.shutdown()
    raise SystemExit(result if isinstance(result, int) else 0)


# How many times ``launch`` has started the job again (0 the first time), in each process's
# environment, as torchrun's TORCHELASTIC_RESTART_COUNT: a restarted job resumes from its checkpoint
RESTART_COUNT = "TRANSFORMER_REF_RESTART_COUNT"


def launch(
    target: Callable,
    *args,
    processes: int,
    cpu_devices: int,
    timeout: float | None = None,
    max_restarts: int = 0,
) -> int:
    """Run ``target(*args)`` in ``processes`` new local processes, each ``initialize``d as one of
    them (a coordinator on 127.0.0.1), with ``cpu_devices`` CPU devices each; -> 0 when every
    process exits 0, else the first failure's exit code (the others are stopped then: they would
    wait for it in their next collective); 124 after ``timeout`` seconds. ``target`` must be
    importable (the processes are forked from a server that imports its module, or spawned afresh;
    their output goes where this one's does).

    ``max_restarts``: when a process fails, every process is stopped and the job started again,
    up to this many times (as ``torchrun --max-restarts``), with a new coordinator and
    ``RESTART_COUNT`` in the environment; the job resumes from its own checkpoint."""
    deadline = None if timeout is None else time.monotonic() + timeout
    context = _context(target)  # JAX's backend is not started here: a process starts its own
    for restart in range(max_restarts + 1):
        code = _launch_once(context, target, args, processes, cpu_devices, deadline, restart)
        if code in (0, 124) or restart == max_restarts:
            return code
        print(f"a process of the job failed (exit status {code}): starting the job again "
              f"(restart {restart + 1} of {max_restarts})", file=sys.stderr,
              flush=True)  # fmt: skip
    return code


# What the fork server imports once, before it forks the processes (with ``target``'s module)
PRELOAD = ("jax", "flax.nnx", "jax_impl", "jax_impl.sharding", "jax_impl.sharded_checkpoint")


def _context(target: Callable):
    """Where the processes come from. On Linux, forked from one server process that has imported
    JAX, this package and ``target``'s module (multiprocessing's fork server, started by the first
    launch and kept by this process): a fresh interpreter spends ~4 s of CPU importing them, each
    process and each restart again. Importing JAX starts no backend and no thread (each process
    starts its own backend, in ``initialize``), so the fork is safe; JAX warns of a fork only after
    its backend has started. Elsewhere, fresh interpreters (macOS's system libraries are not safe to
    fork; Windows cannot)."""
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    module = target.__module__
    if module == "__main__":  # run with -m: the server imports it by its name
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec is not None else None
    context = multiprocessing.get_context("forkserver")
    # read when the server starts (this process's first launch); it then serves every restart,
    # and every later launch of this process (whose preload is then not read again)
    context.set_forkserver_preload([*PRELOAD, *([module] if module else [])])
    return context


def _launch_once(context, target, args, processes, cpu_devices, deadline, restart) -> int:
    coordinator = f"127.0.0.1:{free_port()}"
    environment = dict(os.environ)
    started = [
        context.Process(
            target=_process,
            args=(target, args, coordinator, processes, rank, cpu_devices, restart, environment),
        )
        for rank in range(processes)
    ]
    for process in started:
        process.start()
    try:
        while True:
            codes = [process.exitcode for process in started]
            failed = [code for code in codes if code not in (None, 0)]
            if failed:  # killed by a signal (JAX aborts when another process is gone): 128 + it
                return failed[0] if failed[0] > 0 else 128 - failed[0]
            if all(code == 0 for code in codes):
                return 0
            if deadline is not None and time.monotonic() > deadline:
                return 124
            time.sleep(0.05)
    finally:  # SIGKILL: JAX catches SIGTERM (a preemption notice) and would wait in a collective
        for process in started:
            if process.is_alive():
                process.kill()
            process.join()


# ------------------------------------------------------------------ global arrays, both ways
def _same(arrays):
    """The arrays, unchanged: jitted with other out_shardings, the program that moves them there.
    One function for every call, so that JAX compiles each move once (a new lambda each time
    would be a new program each time)."""
    return arrays


def place(tree: Any, shardings: Any) -> Any:
    """Every array of ``tree`` placed by ``shardings`` (one sharding, or a tree of them), on a mesh
    that may span processes. The arrays of this process are whole, the same in every process, and
    each process fills its own devices' shards from its copy; PRNG keys travel as their raw data.
    The arrays already global are moved among the mesh's devices, all in one program (a
    ``device_put`` each would compile a program each)."""
    import jax

    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)
    leaves, treedef = jax.tree.flatten(tree)
    targets = treedef.flatten_up_to(shardings)

    def mine(x, sharding):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = mine(jax.random.key_data(x), sharding)  # (..., 2) uint32: a key's words
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    moved = [
        i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not x.is_fully_addressable
    ]
    if moved:
        together = jax.jit(_same, out_shardings=[targets[i] for i in moved])
        for i, x in zip(moved, together([leaves[i] for i in moved]), strict=True):
            leaves[i] = x
    for i in sorted(set(range(len(leaves))) - set(moved)):
        leaves[i] = mine(leaves[i], targets[i])
    return jax.tree.unflatten(treedef, leaves)


def replicated(tree: Any) -> Any:
    """Every global array of ``tree`` (on a mesh that spans processes) whole on every device of its
    mesh: one program of all-gathers that every process runs, after which each process reads it
    back with ``np.asarray``, all of them the same numbers. This process's own arrays unchanged."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    leaves, treedef = jax.tree.flatten(tree)
    at = [
        i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not x.is_fully_addressable
    ]
    whole = jax.jit(_same, out_shardings=[NamedSharding(leaves[i].sharding.mesh, P()) for i in at])(
        [leaves[i] for i in at]
    )
    for i, x in zip(at, whole, strict=True):
        leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)


def local(tree: Any) -> Any:
    """Every array of ``tree`` (each whole on every device: ``replicated``) as this process's copy
    on its first device, committed there: what ``device_put`` onto one device gives in one
    process."""
    import jax

    device = jax.local_devices()[0]

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return jax.device_put(x, device)
        if not x.is_fully_replicated:
            raise ValueError(
                f"{x.sharding} is not whole on every device: make it so first (replicated)"
            )
        return jax.device_put(x.addressable_data(0), device)

    return jax.tree.map(one, tree)


__all__ = [
    "ENVIRONMENT",
    "from_environment",
    "free_port",
    "initialize",
    "launch",
    "local",
    "place",
    "replicated",
]
