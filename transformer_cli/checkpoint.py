"""``transformer-ref checkpoint consolidate DIR FILE``: a sharded checkpoint as one file.

A run sharded with ``--fsdp`` / ``--tensor-parallel`` and ``--save DIR`` writes each device's own
pieces, in its framework's own format (torch: torch.distributed.checkpoint; jax: Orbax; numpy: a
file per device). ``consolidate`` reads the newest committed step of DIR (or the step folder given)
into whole tensors and writes the training checkpoint file every backend reads: the weights under
their canonical names, Adam's moments, the step, the losses and the run's settings. So a run
started in torch under FSDP continues in JAX under tensor parallel
(``transformer-ref train --resume FILE --backend jax --tensor-parallel 2 --save DIR2``), or on one
device, and ``compare --weights FILE`` and ``<backend>_impl.load_model`` read the trained model.
Reading torch's or JAX's files needs that framework installed.

Examples:
  transformer-ref train --task copy --backend torch --fsdp 4 --steps 200 --save run/
  transformer-ref checkpoint consolidate run/ run.safetensors
  transformer-ref train --resume run.safetensors --backend jax --tensor-parallel 2 --steps 300 --save run-jax/
"""

from __future__ import annotations

import argparse
import os

from transformer_run.sharded_checkpoint import consolidate
from transformer_spec import WeightsError, WeightsFileError

from .errors import UsageError, missing_extra
from .help import plain, summary


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "checkpoint", help=summary(__doc__), description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    actions = parser.add_subparsers(dest="action", required=True)
    merge = actions.add_parser(
        "consolidate", help="a sharded checkpoint folder as one training checkpoint file",
        description="Write the newest committed step of a sharded checkpoint folder (or the step folder given) as "
        "one .safetensors training checkpoint that every backend loads and resumes.",
    )  # fmt: skip
    merge.add_argument("folder", metavar="DIR", help="a run's --save folder, or one of its step-N folders")
    merge.add_argument("file", metavar="FILE", help="the .safetensors file to write")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.folder):
        raise UsageError(f"{args.folder}: not a folder (a sharded run's --save DIR)")
    folder = os.path.dirname(os.path.abspath(args.file))
    if os.path.isdir(args.file):
        raise UsageError(f"{args.file} is a folder: give a file name (run.safetensors)")
    if not os.path.isdir(folder):
        raise UsageError(f"{args.file}: the folder {folder} does not exist")
    try:
        checkpoint = consolidate(args.folder, args.file)
    except (WeightsFileError, WeightsError) as error:
        raise UsageError(f"{args.folder}: {error}") from None
    except ModuleNotFoundError as error:
        extra = "torch" if (error.name or "").startswith("torch") else "jax"  # whose files these are
        raise missing_extra(f"reading {args.folder}", error, extra) from None
    plan = checkpoint.plan
    print(f"{args.file}: step {checkpoint.state.step} of a {checkpoint.framework} run sharded over {plan.devices} "
          f"devices (data parallel {plan.data_parallel} x fsdp {plan.fsdp} x tensor parallel "
          f"{plan.tensor_parallel}), {checkpoint.config.kind}; every backend loads it and resumes it "
          f"(transformer-ref train --resume {args.file})")  # fmt: skip
    return 0
