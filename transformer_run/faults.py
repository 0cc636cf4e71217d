"""A lost rank, on purpose: the fault a run must survive, injected where it hurts most, once.

A sharded run loses a device when its process dies (killed, out of memory, its machine gone). What
must hold then: the job restarts from the last complete checkpoint (a save the death interrupted is
never read: ``transformer_run.sharded_checkpoint`` commits a step's folder with one rename) and ends
exactly where the uninterrupted run ends. To test that, set

    TRANSFORMER_REF_FAULT=<where>:<step>:<rank>:<marker file>

where is ``step`` (in the middle of the step: after the gradients, before the update) or ``save``
(in the middle of the step's checkpoint: after this rank wrote its shards, before the others have
all written and the folder is committed). The process of that rank, at that step, creates the
marker file and kills itself with SIGKILL (no cleanup, no exception: as the kernel's OOM killer
would); the marker makes it happen once, so the restarted job (torchrun's ``--max-restarts``, the
JAX launcher's, the same environment) runs through. Several faults, comma-separated, each with its
own marker (``step:3:1:a,save:4:0:b``), lose a rank each in turn: a job restarted twice. NumPy's
simulated devices live in one process: there the device raises ``LostDeviceError`` instead, and
``sharded_train(max_restarts=...)`` restarts.
"""

from __future__ import annotations

import os
import signal

ENVIRONMENT = "TRANSFORMER_REF_FAULT"
WHERE = ("step", "save")


class LostDeviceError(RuntimeError):
    """A simulated device died (NumPy's reference: its devices are threads of one process)."""


def planned() -> list[tuple[str, int, int, str]]:
    """The faults the environment asks for: [(where, step, rank, marker)], none if it asks none."""
    spec = os.environ.get(ENVIRONMENT)
    faults = []
    for one in spec.split(",") if spec else ():
        try:
            where, step, rank, marker = one.split(":", 3)
            fault = (where, int(step), int(rank), marker)
        except ValueError:
            fault = None
        if fault is None or where not in WHERE or not marker:
            raise ValueError(f"{ENVIRONMENT}={spec!r}: expected <step|save>:<step>:<rank>:<marker file>, "
                             f"comma-separated, not {one!r}")  # fmt: skip
        faults.append(fault)
    return faults


def maybe_fail(where: str, step: int, rank: int, *, kill: bool = True) -> None:
    """Die here if the environment plans it for (where, step, rank) and it has not happened yet:
    SIGKILL this process (``kill``), or raise ``LostDeviceError`` (a simulated device)."""
    for fault in planned():
        if fault[:3] != (where, step, rank):
            continue
        try:
            os.close(os.open(fault[3], os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # once
        except FileExistsError:
            continue
        break
    else:
        return
    if not kill:
        what = f"step {step}" if where == "step" else f"step {step}'s checkpoint"
        raise LostDeviceError(f"device {rank} lost in the middle of {what}")
    os.kill(os.getpid(), signal.SIGKILL)
