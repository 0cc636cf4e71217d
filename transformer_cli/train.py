"""``transformer-ref train``: train a toy task in one backend, then use the model.

Tasks (all shipped in the repository, nothing downloaded):
  copy       random 5-symbol sequences -> the same sequence (the classic sanity check)
  reverse    random 5-symbol sequences -> the sequence reversed
  translate  the tutorials' toy English -> "French" corpus (6 sentence pairs)
  next-word  the tutorials' next-word corpus, a decoder-only language model

Shows a progress bar (step, loss, target tokens per second), then greedy outputs of the
trained model: held-out sequences for copy/reverse, the corpus for translate, sentence
continuations for next-word.

``--save FILE`` writes a training checkpoint every ``--checkpoint-every`` steps (default 100)
and after the last one, atomically: a run killed at any moment, in the middle of a save too,
leaves the previous checkpoint whole. Every backend loads it as the trained model
(``transformer-ref compare --weights FILE``, ``<backend>_impl.load_model``); ``--resume FILE``
continues the run from it exactly as if it had never stopped (the same weights, Adam's
moments and step, the schedule's position, the batches and the dropout masks: the float64
loss curve is the uninterrupted one), with the settings stored in it.

``--data-parallel N`` trains on N replicas, each taking 1/N of every batch, their gradients
added up so that the step is the single-device one (the loss over the whole batch's non-pad
targets): torch spawns N DistributedDataParallel processes (gloo on the CPU, nccl on GPUs; run
under torchrun, each process is one replica instead), JAX shards the batch over N devices
(simulated on the CPU when there are fewer: XLA_FLAGS=--xla_force_host_platform_device_count=N),
NumPy splits it into N shards run in turn. Every replica draws the one device's dropout masks
and keeps its rows: with dropout too, the run is the single-device run with the same seed.

``--fsdp N`` shards every weight, its gradient and its Adam moments over N devices that each take
1/N of the batch (fully sharded data parallel: a layer's weights are gathered just before it runs,
its gradients reduce-scattered); ``--tensor-parallel K`` splits each attention's heads and each
feed-forward's hidden features over K devices (Megatron's column-then-row split). They combine with
each other, and ``--tensor-parallel`` with ``--data-parallel``, on data x model devices: torch
processes, JAX devices, NumPy devices simulated in this process. A plan that cannot work (a degree
that does not divide the heads, the key/value heads, d_ff, a weight's dimension or the batch) is
refused before anything starts; ``--heads`` and ``--d-ff`` resize the task's model to fit one.

``--processes N`` (JAX, with a plan) runs the plan on one mesh over the devices of N processes,
each ``jax.distributed.initialize``d, as multi-host JAX runs: without a process id, N local
processes are spawned here, each with plan-devices / N CPU devices; with ``--process-id I`` (or
JAX_PROCESS_ID) and ``--coordinator HOST:PORT`` (or JAX_COORDINATOR_ADDRESS: process 0's machine
and a free port, the same for all), this process is process I of N, started by hand or by a
scheduler on each machine. Every process computes the same losses and weights; process 0 alone
prints and writes files.

A lost process: ``--max-restarts N`` starts the run again from the newest committed checkpoint of
--save DIR, up to N times (numpy's simulated devices; jax's --processes; torch: run under
``torchrun --max-restarts N``, which starts the ranks again; a restarted command goes on from DIR).

``--compile`` compiles torch's training step (its forward pass, loss and backward pass, through
torch.compile; Adam's update as it is); JAX's step is always jit-compiled and NumPy has no compiler.
It trains on one device, in float32 or float64 (bf16 and the parallel runs stay eager).

With a plan, ``--save DIR`` writes sharded checkpoints into the folder DIR: each device its own
pieces (torch: torch.distributed.checkpoint; jax: Orbax; numpy: a file per device), no device ever
holding the whole model; a step's checkpoint is committed at once (a save killed half-way is never
read). ``--resume DIR`` continues it under the plan given (another one too: the checkpoint is
resharded as it is read), or under the plan it was saved with. ``transformer-ref checkpoint
consolidate DIR FILE`` makes it one file, which every backend resumes (``--resume FILE``, with
``--backend`` another framework if you like, on one device or under a plan).

Examples:
  transformer-ref train --task translate --steps 300 --save translate.safetensors
  transformer-ref train --resume translate.safetensors --steps 400      # 100 steps more
  transformer-ref train --task copy --backend torch --plot loss.png      # one torch thread: see --threads
  transformer-ref train --task copy --backend torch --data-parallel 2    # 2 DDP processes, 16 rows each
  transformer-ref train --task next-word --heads 4 --d-ff 48 --fsdp 2 --tensor-parallel 2   # 4 devices
  transformer-ref train --task next-word --heads 4 --d-ff 48 --fsdp 2 --tensor-parallel 2 --backend jax \
      --processes 2                                                      # 2 processes of 2 devices
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
import time

import numpy as np

from transformer_backends.names import BACKENDS
from transformer_run.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from transformer_run.data import (
    BOS,
    EOS,
    NEXT_WORD,
    TOY_TRANSLATION,
    WordVocab,
    copy_task,
    next_word_batch,
    pad,
    translation_batch,
)
from transformer_run.data_parallel import batch_size, check_data_parallel
from transformer_run.schedules import warmup_schedule
from transformer_run.sharded_checkpoint import ShardedCheckpoint, is_sharded_checkpoint
from transformer_run.sharded_checkpoint import read as read_sharded
from transformer_run.sharding import Plan, check_plan
from transformer_spec import Config, WeightsError, WeightsFileError, init_params

from .compile import add_compile_argument, note
from .errors import (
    UsageError,
    dropout_rate,
    get_installed_backend,
    missing_extra,
    non_negative_int,
    positive_int,
    probability,
    seed,
    usage_error,
)
from .help import plain, summary
from .threads import add_threads_argument, use_threads

TASKS = ("copy", "reverse", "translate", "next-word")
DEFAULT_STEPS = {"copy": 600, "reverse": 600, "translate": 300, "next-word": 300}
# The settings of a run (argparse's dest -> default). A resumed run takes them from its checkpoint;
# an option given again must agree with it.
RUN_DEFAULTS = {"task": "copy", "backend": "numpy", "dtype": "float32", "warmup": 200, "label_smoothing": 0.0,
                "dropout": 0.0, "seed": 0}  # fmt: skip


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "train", help=summary(__doc__), description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=TASKS, help="what to learn: see Tasks above (default: copy)")
    parser.add_argument("--backend", choices=BACKENDS, help="which backend trains (default: numpy)")
    parser.add_argument(
        "--steps", type=positive_int, help="optimiser steps in all (default: 600 for copy/reverse, 300 otherwise)"
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "float64", "bfloat16"],
        help="the weights' float type (default: float32); bfloat16: mixed precision, float32 weights and Adam with "
        "bf16 compute (torch.autocast, Flax's compute dtype, NumPy's emulation)",
    )
    parser.add_argument("--warmup", type=positive_int, help="warm-up steps of the paper's schedule (default: 200)")
    parser.add_argument(
        "--label-smoothing",
        type=probability,
        help="share of each target's probability spread over the vocabulary (the paper: 0.1; default: 0)",
    )
    parser.add_argument("--dropout", type=dropout_rate, help="dropout rate while training (the paper: 0.1; default: 0)")
    parser.add_argument("--seed", type=seed, help="seed of the weights, the data and dropout (default: 0)")
    parser.add_argument("--save", metavar="FILE", help="write training checkpoints (.safetensors) to FILE")
    parser.add_argument(
        "--checkpoint-every",
        type=positive_int,
        metavar="N",
        help="with --save: a checkpoint every N steps, and after the last (default: 100, or the resumed run's)",
    )
    parser.add_argument(
        "--resume",
        metavar="FILE",
        help="continue the run checkpointed in FILE (its settings; --steps may raise the total); saves to FILE "
        "unless --save says otherwise",
    )
    parser.add_argument(
        "--data-parallel",
        type=positive_int,
        metavar="N",
        help="train on N replicas, each on 1/N of every batch (torch: N DDP processes spawned here; jax: N "
        "devices, simulated on the CPU if fewer exist; numpy: N shards in turn); the batch must split evenly",
    )
    parser.add_argument(
        "--fsdp",
        type=positive_int,
        metavar="N",
        help="shard every weight, gradient and Adam moment over N devices, each on 1/N of every batch "
        "(fully sharded data parallel); N must divide the dimension it splits of every weight",
    )
    parser.add_argument(
        "--tensor-parallel",
        type=positive_int,
        metavar="K",
        help="split each attention's heads and each feed-forward's hidden features over K devices "
        "(Megatron); K must divide the heads, the key/value heads and d_ff",
    )
    parser.add_argument(
        "--processes",
        type=positive_int,
        metavar="N",
        help="jax, with --fsdp/--tensor-parallel: one mesh over the devices of N processes (jax.distributed); "
        "without a process id, N local processes spawned here, each with plan-devices / N CPU devices",
    )
    parser.add_argument(
        "--process-id",
        type=non_negative_int,
        metavar="I",
        help="with --processes: this process is process I of N, started by hand or by a scheduler "
        "(default: $JAX_PROCESS_ID); process 0 runs the coordinator",
    )
    parser.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="with --process-id: process 0's machine and a free port, the same for every process "
        "(default: $JAX_COORDINATOR_ADDRESS)",
    )
    parser.add_argument(
        "--max-restarts",
        type=non_negative_int,
        metavar="N",
        help="with a plan and --save DIR: when a device (numpy) or a process (jax --processes) is lost, start "
        "again from the newest committed checkpoint, up to N times (torch: torchrun --max-restarts N)",
    )
    parser.add_argument("--heads", type=positive_int, metavar="H", help="the task model's attention heads")
    parser.add_argument("--d-ff", type=positive_int, metavar="N", help="the task model's feed-forward width")
    parser.add_argument("--plot", metavar="PNG", help="draw the loss of every step into this PNG (needs matplotlib)")
    add_compile_argument(parser)
    add_threads_argument(parser)
    parser.set_defaults(run=run)


def task_setup(task: str, seed: int):
    """-> (config, training batches, a function that shows what the trained model does)."""
    if task in ("copy", "reverse"):
        config = Config.preset("tiny", src_vocab_size=12, tgt_vocab_size=12, max_len=16, norm_first=True)
        batches = [copy_task(32, 5, 12, seed=seed + s, reverse=task == "reverse") for s in range(100)]
        return config, batches, lambda backend, model: show_copy(backend, model, task)
    if task == "translate":
        src_vocab = WordVocab.from_sentences([s for s, _ in TOY_TRANSLATION])
        tgt_vocab = WordVocab.from_sentences([t for _, t in TOY_TRANSLATION])
        config = Config.preset(
            "tiny", src_vocab_size=len(src_vocab), tgt_vocab_size=len(tgt_vocab), max_len=16, norm_first=True
        )
        batches = [translation_batch(TOY_TRANSLATION, src_vocab, tgt_vocab)]
        return config, batches, lambda backend, model: show_translation(backend, model, src_vocab, tgt_vocab)
    vocab = WordVocab.from_sentences(NEXT_WORD)
    config = Config.preset("tiny-lm", tgt_vocab_size=len(vocab), max_len=16)
    return config, [next_word_batch(NEXT_WORD, vocab)], lambda backend, model: show_generation(backend, model, vocab)


def run(args: argparse.Namespace) -> int:
    _continue_a_restarted_job(args)
    resumed = _load_resumed(args.resume) if args.resume else None
    settings = _settings(args, resumed)
    save = args.save or args.resume
    if args.checkpoint_every is not None and not save:
        raise UsageError(f"--checkpoint-every {args.checkpoint_every} needs --save FILE (where to write them)")
    sharded = bool(args.fsdp or args.tensor_parallel) or isinstance(resumed, ShardedCheckpoint)
    if save and sharded:
        _check_folder("--save" if args.save else "--resume", save)
    elif save:
        _check_writable("--save" if args.save else "--resume", save)
    if args.data_parallel and not (args.fsdp or args.tensor_parallel) and (save or resumed):
        option = "--save" if args.save else "--resume"
        raise UsageError(f"--data-parallel {args.data_parallel} does not checkpoint yet: leave out {option}")
    plan = _sharding_plan(args, resumed, settings)
    process_id, coordinator = _processes(args, plan, settings)
    _check_restarts(args, plan, settings, save)
    if args.compile and (args.data_parallel or plan is not None):
        raise UsageError(f"--compile compiles the one-device step: leave out {_plan_options(args)}")
    if args.compile and settings["dtype"] == "bfloat16":
        raise UsageError("--compile compiles the float32 and float64 steps: bfloat16 runs eagerly, leave one out")
    if settings["backend"] == "jax" and (args.data_parallel or plan is not None) and not args.processes:
        _simulate_cpu_devices(args.data_parallel if plan is None else plan.devices)
    backend = get_installed_backend(settings["backend"])
    if args.plot:
        _check_plot(args.plot)
    config, batches, show = task_setup(settings["task"], settings["seed"])
    for size in ("heads", "d_ff"):  # a resumed run's model resized as it was
        if resumed and getattr(args, size) is None:
            setattr(args, size, resumed.run.get(size))
    config = _resized(config.replace(dropout=settings["dropout"]), args)
    done = resumed.state.step if resumed else 0
    steps = args.steps or (resumed.run["steps"] if resumed else DEFAULT_STEPS[settings["task"]])
    every = args.checkpoint_every or (resumed.run.get("checkpoint_every") if resumed else None) or 100
    if steps < done:
        raise UsageError(f"--steps {steps}: the run in {args.resume} has already done {done} steps")
    if resumed and resumed.config != config:
        raise UsageError(f"--resume {args.resume}: its config is not the one task {settings['task']!r} trains")
    sharded_train = None
    if plan is not None:
        # under torchrun the processes exist already: the plan must use exactly WORLD_SIZE of them
        world = os.environ.get("WORLD_SIZE") if settings["backend"] == "torch" else None
        for batch in batches:
            try:
                check_plan(config, plan, batch_size(config, batch), int(world) if world else None)
            except ValueError as error:
                raise UsageError(f"{_plan_options(args)}: task {settings['task']}: {error}") from None
        sharded_train = _sharded_train(settings["backend"], args)
    elif args.data_parallel:
        for batch in batches:
            try:
                check_data_parallel(batch_size(config, batch), args.data_parallel)
            except ValueError as error:
                raise UsageError(f"--data-parallel {args.data_parallel}: task {settings['task']}: {error}") from None
    if args.processes and process_id is None:  # the launcher: the same run in N local processes
        from jax_impl import distributed

        return distributed.launch(_process_run, args, processes=args.processes,
                                  cpu_devices=plan.devices // args.processes,
                                  max_restarts=args.max_restarts or 0)  # fmt: skip
    quiet = False  # a process of a multi-process run other than 0
    if args.processes:
        quiet = _join(args, plan, process_id, coordinator) != 0
        if quiet:
            _silence_this_process()
    compute_dtype = "bfloat16" if settings["dtype"] == "bfloat16" else None  # mixed precision: float32 master weights
    weights_dtype = "float32" if compute_dtype else settings["dtype"]
    params = getattr(resumed, "params", None) or init_params(config, seed=settings["seed"], dtype=weights_dtype)
    model = backend.impl.build_model(config, params)
    threads = use_threads(args.threads, [settings["backend"]], sum(np.size(v) for v in params.values()))
    schedule = warmup_schedule(config.d_model, settings["warmup"])
    tokens_per_step = [int((b.get("tgt_out", b.get("targets")) != config.pad_id).sum()) for b in batches]
    where = f", resumed at step {done} from {args.resume}" if resumed else ""
    print(f"training {settings['task']} in {settings['backend']} ({settings['dtype']}): {config.kind}, "
          f"d_model {config.d_model}, {steps} steps, Adam with the paper's warm-up schedule ({settings['warmup']} "
          f"steps){where}" + (f", {threads} torch thread{'s' * (threads > 1)}" if threads else "")
          + (f", data parallel over {args.data_parallel} replicas" if args.data_parallel and not plan else "")
          + (f", sharded over {plan.devices} devices ({_plan_options(args)})" if plan else "")
          + (f" in {args.processes} processes" if args.processes else ""))  # fmt: skip
    run_record = settings | {"steps": steps, "checkpoint_every": every, "heads": args.heads, "d_ff": args.d_ff}

    def checkpoint(state) -> None:
        if not quiet:  # every process holds the same state: process 0 writes it
            save_checkpoint(save, config, backend.impl.to_params(model), state, run_record)

    if note([settings["backend"]], args.compile):
        print(note([settings["backend"]], args.compile))
    progress = ProgressBar(steps, tokens_per_step)
    if sharded_train is not None:
        losses = sharded_train(
            model, batches, steps, schedule, settings["label_smoothing"], callback=progress,
            seed=settings["seed"], plan=plan, checkpoint_every=every, checkpoint_dir=save or None,
            resume=resumed if isinstance(resumed, ShardedCheckpoint) else resumed and resumed.state,
            run_record=run_record,
            **({"max_restarts": args.max_restarts} if args.max_restarts and settings["backend"] == "numpy" else {}),
        )  # fmt: skip
    elif args.data_parallel:
        try:
            losses = backend.impl.data_parallel_train(
                model, batches, steps, schedule, settings["label_smoothing"], callback=progress,
                seed=settings["seed"], data_parallel=args.data_parallel, compute_dtype=compute_dtype,
            )  # fmt: skip
        except ValueError as error:  # JAX: fewer devices than replicas
            raise UsageError(f"--data-parallel {args.data_parallel}: {error}") from None
    else:
        losses = backend.impl.train(
            model, batches, steps, schedule, settings["label_smoothing"], callback=progress, seed=settings["seed"],
            resume=resumed.state if resumed else None, checkpoint=checkpoint if save else None,
            checkpoint_every=every, compute_dtype=compute_dtype, compiled_step=args.compile,
        )  # fmt: skip
    progress.close()
    if save and plan is not None:
        print(f"sharded checkpoint: {save} (--resume {save} continues it, under any plan; "
              f"transformer-ref checkpoint consolidate {save} FILE makes it one file every backend loads)")
    elif save:
        print(f"checkpoint: {save} (--resume {save} continues it; every backend loads it: <backend>_impl.load_model)")
    if losses:
        print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f}\n")
    if quiet:  # process 0 shows what the model learned
        return 0
    if args.plot and losses:
        from .plots import loss_figure

        title = f"{settings['task']} in {settings['backend']} ({settings['dtype']}), {len(losses)} steps"
        loss_figure(losses, title).savefig(args.plot, dpi=120)
        print(f"loss curve: {args.plot}")
    show(backend, model)
    return 0


# Set in the processes of a job started again after one of them died: torchrun's (--max-restarts)
# and jax_impl.distributed.launch's
RESTART_ENVIRONMENT = ("TORCHELASTIC_RESTART_COUNT", "TRANSFORMER_REF_RESTART_COUNT")


def _continue_a_restarted_job(args: argparse.Namespace) -> None:
    """A job restarted after a lost process runs the same command again: with --save DIR holding
    committed checkpoints it goes on from the newest (--resume DIR). A new run refuses such a
    folder rather than mixing its checkpoints with another run's."""
    if args.resume or not args.save or not is_sharded_checkpoint(args.save):
        return
    if any(int(os.environ.get(variable) or 0) > 0 for variable in RESTART_ENVIRONMENT):
        args.resume = args.save
        return
    step = read_sharded(args.save).state.step
    raise UsageError(
        f"--save {args.save} holds a run's checkpoints (the newest at step {step}): --resume {args.save} "
        "continues it; give another folder to start a new run"
    )


def _check_restarts(args: argparse.Namespace, plan: Plan | None, settings: dict, save: str | None) -> None:
    """--max-restarts restarts what this command runs: NumPy's simulated devices, or the JAX
    processes it launches; torchrun restarts torch's (torchrun --max-restarts N)."""
    if not args.max_restarts:
        return
    option = f"--max-restarts {args.max_restarts}"
    if settings["backend"] == "torch":
        raise UsageError(f"{option}: torchrun restarts torch's processes: torchrun --max-restarts "
                         f"{args.max_restarts} ... transformer-ref train ...")  # fmt: skip
    if plan is None or not save:
        raise UsageError(f"{option}: restarts a sharded run from its checkpoints: give --fsdp or "
                         "--tensor-parallel, and --save DIR")  # fmt: skip
    if settings["backend"] == "jax" and not args.processes:
        raise UsageError(f"{option}: restarts the processes of --processes N (one process does not lose a "
                         "device alone)")  # fmt: skip


def _plan_options(args: argparse.Namespace) -> str:
    """The sharding options as given: "--fsdp 2 --tensor-parallel 3"."""
    given = [("--data-parallel", args.data_parallel), ("--fsdp", args.fsdp),
             ("--tensor-parallel", args.tensor_parallel)]  # fmt: skip
    return " ".join(f"{option} {value}" for option, value in given if value)


def _sharding_plan(args: argparse.Namespace, resumed, settings: dict) -> Plan | None:
    """The plan of --fsdp / --tensor-parallel (with --data-parallel); without them, a resumed sharded
    checkpoint's own plan, else None. The settings they cannot run with are refused here, before
    anything starts."""
    if not (args.fsdp or args.tensor_parallel):
        if isinstance(resumed, ShardedCheckpoint):
            if args.data_parallel:
                raise UsageError(f"--data-parallel {args.data_parallel}: give the whole plan to resume "
                                 f"{args.resume} under another one (--fsdp, --tensor-parallel)")  # fmt: skip
            return resumed.plan
        return None
    if resumed and not args.save and not isinstance(resumed, ShardedCheckpoint):
        raise UsageError(f"{_plan_options(args)}: a sharded run saves into a folder: give --save DIR to resume "
                         f"{args.resume} under it")  # fmt: skip
    if settings["dtype"] == "bfloat16":
        raise UsageError(f"{_plan_options(args)}: sharded runs train in float32 or float64, not --dtype bfloat16")
    try:
        return Plan(args.data_parallel or 1, args.fsdp or 1, args.tensor_parallel or 1)
    except ValueError as error:
        raise UsageError(f"{_plan_options(args)}: {error}") from None


def _processes(args: argparse.Namespace, plan: Plan | None, settings: dict) -> tuple[int | None, str | None]:
    """With --processes: (this process's id, the coordinator's address), from the options or the
    environment; the id None: spawn the processes here. What cannot run is refused first."""
    from_env = {name: os.environ.get(variable) or None for name, variable in PROCESS_ENVIRONMENT.items()}
    process_id = args.process_id if args.process_id is not None else from_env["process_id"]
    coordinator = args.coordinator or from_env["coordinator"]
    if not args.processes:
        for option, value in (("--process-id", args.process_id), ("--coordinator", args.coordinator)):
            if value is not None:
                raise UsageError(f"{option} {value}: a process of a multi-process run: give --processes N too")
        return None, None
    option = f"--processes {args.processes}"
    if settings["backend"] != "jax":
        raise UsageError(f"{option}: the jax backend's (torch starts its own processes: --fsdp, --tensor-parallel)")
    if plan is None:
        raise UsageError(f"{option}: runs a sharded plan across processes: give --fsdp or --tensor-parallel")
    if plan.devices % args.processes:
        raise UsageError(f"{option}: the plan's {plan.devices} devices do not split evenly over the processes")
    if process_id is None:  # the launcher, whose coordinator is on this machine, at a free port
        if args.coordinator is not None:
            raise UsageError(f"--coordinator {args.coordinator}: for a process started with --process-id")
        return None, None
    try:
        process_id = int(process_id)
    except ValueError:
        raise UsageError(f"JAX_PROCESS_ID={process_id!r} is not a process id (0, 1, ...)") from None
    if not 0 <= process_id < args.processes:
        raise UsageError(f"--process-id {process_id}: {option} numbers them 0 .. {args.processes - 1}")
    if coordinator is None:
        raise UsageError(f"--process-id {process_id}: give --coordinator HOST:PORT (or JAX_COORDINATOR_ADDRESS)")
    return process_id, coordinator


# Where --process-id and --coordinator are read from when not given (a scheduler sets them)
PROCESS_ENVIRONMENT = {"process_id": "JAX_PROCESS_ID", "coordinator": "JAX_COORDINATOR_ADDRESS"}


def _join(args: argparse.Namespace, plan: Plan, process_id: int, coordinator: str) -> int:
    """This process into the run (``jax.distributed``; a spawned one has joined already, before
    the run started in it), with plan-devices / N CPU devices; -> its id."""
    import jax

    from jax_impl import distributed

    if not jax.distributed.is_initialized():
        try:
            distributed.initialize(coordinator, args.processes, process_id,
                                   cpu_devices=plan.devices // args.processes)  # fmt: skip
        except ValueError as error:
            raise UsageError(f"--processes {args.processes}: {error}") from None
    return jax.process_index()


def _silence_this_process() -> None:
    """Standard output to /dev/null for the rest of this process, at the file descriptor: gloo
    writes to it from C++ when it connects the processes, from its own threads, and a connection
    made by the last collective printed after the run had returned."""
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # Python's sys.stdout writes there too
    os.close(devnull)


def _process_run(args: argparse.Namespace) -> int:
    """A spawned process of ``--processes N``: the same run; its place in the environment."""
    try:
        return run(args)
    except UsageError as error:
        raise usage_error("train", str(error)) from None


def _sharded_train(backend: str, args: argparse.Namespace):
    """``<backend>_impl.sharding.sharded_train``, or a one-line refusal where the backend has none."""
    try:
        module = importlib.import_module(f"{backend}_impl.sharding")
    except ModuleNotFoundError as error:
        if error.name != f"{backend}_impl.sharding":
            raise
        module = None
    train = getattr(module, "sharded_train", None)
    if train is None or "plan" not in inspect.signature(train).parameters:  # the entry point's contract
        raise UsageError(f"{_plan_options(args)}: the {backend} backend has no sharded training yet")
    return train


def _resized(config: Config, args: argparse.Namespace) -> Config:
    """The task's model with the --heads and --d-ff given (a plan may need them to divide)."""
    sizes = {"num_heads": args.heads, "d_ff": args.d_ff}
    sizes = {name: value for name, value in sizes.items() if value is not None}
    try:
        return config.replace(**sizes) if sizes else config
    except ValueError as error:
        options = " ".join(f"--{n.replace('num_', '').replace('_', '-')} {v}" for n, v in sizes.items())
        raise UsageError(f"{options}: {error}") from None


def _simulate_cpu_devices(replicas: int) -> None:
    """Let JAX show the CPU as ``replicas`` devices, where there are fewer accelerators. The flag only
    acts before JAX starts; once it has (a caller that imported it), the config option may still."""
    if "jax" not in sys.modules:
        flag = f"--xla_force_host_platform_device_count={replicas}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
        return
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", replicas)
    except RuntimeError:  # JAX's backends have started: data_parallel_mesh says if it has too few devices
        pass


def _check_plot(path: str) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise missing_extra("--plot (drawing the loss curve)", error, "plots") from None
    _check_writable("--plot", path)


def _load_resumed(path: str) -> Checkpoint | ShardedCheckpoint:
    try:
        resumed = read_sharded(path) if is_sharded_checkpoint(path) else load_checkpoint(path)
    except (WeightsFileError, WeightsError) as error:
        raise UsageError(f"--resume {path}: {error}") from None
    missing = sorted((set(RUN_DEFAULTS) | {"steps"}) - set(resumed.run))
    if missing:
        raise UsageError(f"--resume {path}: not a checkpoint of transformer-ref train (its run lacks {missing})")
    if "framework" in resumed.run:  # consolidated from a sharded checkpoint: its framework trained it
        resumed.run["backend"] = resumed.run.pop("framework")
        resumed.run.pop("plan", None)
    return resumed


def _settings(args: argparse.Namespace, resumed: Checkpoint | None) -> dict:
    """The run's settings: the options given, else the checkpoint's (when resuming), else the defaults.
    Resuming with another setting than the checkpoint's would not continue the same run: refused."""
    settings = {}
    for name, default in RUN_DEFAULTS.items():
        given = getattr(args, name)
        stored = resumed.run[name] if resumed else None
        if resumed and given is not None and given != stored and _may_differ(name, resumed):
            settings[name] = given
            continue
        if resumed and given is not None and given != stored and isinstance(resumed, ShardedCheckpoint):
            if name == "backend":
                raise UsageError(
                    f"--backend {given}: {args.resume} holds {stored}'s own files; to continue in {given}: "
                    f"transformer-ref checkpoint consolidate {args.resume} FILE, then --resume FILE --backend {given}"
                )
        if resumed and given is not None and given != stored and name == "backend" and isinstance(resumed, Checkpoint):
            raise UsageError(
                f"--backend {given}: the run in {args.resume} draws {stored}'s dropout masks (--dropout "
                f"{resumed.run['dropout']}), which {given} cannot continue (each framework its own generator): "
                f"resume it with --backend {stored}"
            )
        if resumed and given is not None and given != stored:
            option = "--" + name.replace("_", "-")
            raise UsageError(
                f"{option} {given}: the run in {args.resume} was trained with {option} {stored}; resume it with "
                "the same (or leave the option out)"
            )
        settings[name] = given if given is not None else stored if resumed else default
    return settings


def _may_differ(name: str, resumed) -> bool:
    """A one-file checkpoint continues in another backend (the same weights, moments and step): its
    numbers go on within the frameworks' rounding. Not with dropout: each framework draws its own
    masks, from its own random streams. A sharded checkpoint is its framework's own files."""
    return (
        name == "backend" and isinstance(resumed, Checkpoint) and resumed.run.get("dropout", 0) == 0
    )


def _check_folder(option: str, path: str) -> None:
    """A sharded run's checkpoints go into a folder: made if need be, in a folder that exists."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{option} {path} is a file: a sharded run saves into a folder (give a folder name)")
    if not os.path.isdir(parent):
        raise UsageError(f"{option} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (os.path.isdir(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{option} {path}: not writable")
    os.makedirs(path, exist_ok=True)


def _check_writable(option: str, path: str) -> None:
    """Before training, not after: a folder that does not exist, or a folder given as the file."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{option} {path} is a folder: give a file name (run.safetensors)")
    if not os.path.isdir(folder):
        raise UsageError(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {path}: the folder {folder} is not writable")


class ProgressBar:
    """``step/total [#####.....] loss  tokens/s`` on one line, redrawn in place."""

    def __init__(self, total: int, tokens_per_step: list[int], width: int = 30):
        self.total, self.tokens_per_step, self.width = total, tokens_per_step, width
        self.start, self.tokens = time.perf_counter(), 0

    def __call__(self, step: int, loss: float) -> None:
        self.tokens += self.tokens_per_step[(step - 1) % len(self.tokens_per_step)]
        if step % max(1, self.total // 200) and step != self.total:
            return  # redraw about 200 times in all
        done = int(self.width * step / self.total)
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        bar = "#" * done + "." * (self.width - done)
        sys.stdout.write(f"\rstep {step:>5}/{self.total} [{bar}] loss {loss:8.4f}  {rate:9.0f} tokens/s")
        sys.stdout.flush()

    def close(self) -> None:
        sys.stdout.write(f"  ({time.perf_counter() - self.start:.1f} s)\n")


def show_copy(backend, model, task: str) -> None:
    held_out = copy_task(50, 5, 12, seed=12345, reverse=task == "reverse")
    out = backend.impl.greedy(model, held_out["src_ids"], BOS, EOS, max_len=6)  # (50, <= 7)
    want = held_out["tgt_out"][:, :5]
    exact = np.all(out[:, 1:6] == want, axis=1)
    print(f"greedy decoding of 50 held-out sequences: {int(exact.sum())}/50 exactly right")
    for row in range(5):
        print(f"  {held_out['src_ids'][row].tolist()} -> {out[row, 1:6].tolist()}  {'ok' if exact[row] else 'WRONG'}")


def show_translation(backend, model, src_vocab: WordVocab, tgt_vocab: WordVocab) -> None:
    src = pad([src_vocab.encode(s, bos=False) for s, _ in TOY_TRANSLATION])
    out = backend.impl.greedy(model, src, BOS, EOS, max_len=8)
    print("greedy translations:")
    for (english, french), ids in zip(TOY_TRANSLATION, out, strict=True):
        said = tgt_vocab.decode(ids)
        print(f"  {english:<16} -> {said:<20} {'ok' if said == french else '(reference: ' + french + ')'}")


def show_generation(backend, model, vocab: WordVocab) -> None:
    print("greedy continuations of each prompt:")
    for prompt in ("the cat", "the dog", "the girl", "the boy"):
        ids = vocab.encode(prompt, eos=False)  # <bos> the cat
        # a decoder-only stepper reads the prompt, then its "bos": here the prompt's last word
        out = backend.impl.greedy(model, np.array([ids[:-1]]), ids[-1], EOS, max_len=6)
        print(f"  {prompt!r:<12} -> {vocab.decode(ids[:-1] + out[0].tolist())!r}")
