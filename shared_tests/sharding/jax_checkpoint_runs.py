"""What test_jax_checkpoints.py checks, computed in test_jax_sharding.py's child for the Llama-style
decoder (4 simulated CPU devices, its tensor-parallel programs compiled already): runs saved under
each plan, resumed under each, a killed save, what ``restore`` places and ``whole_tensors`` reads."""

from __future__ import annotations

import os

import numpy as np

from transformer_run.sharding import Plan

from .cases import PLANS, adam_config, batch_of, schedule

MODEL = "llama"
SAVED = {"fsdp-4": Plan(fsdp=4), "tp": PLANS["tp"], "fsdp-x-tp": PLANS["fsdp-x-tp"]}
RESUMED = {**SAVED, "one-device": Plan()}
REFERENCE = "tp"  # the uninterrupted run's plan (its program compiled by the child already)
SAVED_AT, STEPS = 3, 6
KILLED = "fsdp-4"  # whose folder also holds a save killed before its commit (step SAVED_AT + 1)


class KilledError(Exception):
    """A process ended between writing its shards and committing them."""


# ------------------------------------------------------------------------------ in the child
def checkpoint_runs(folder: str) -> dict[str, np.ndarray]:
    """On 4 simulated devices (test_jax_sharding.py's child): the uninterrupted run (STEPS steps
    under REFERENCE, its whole tensors at SAVED_AT), a run saved at SAVED_AT under each of SAVED,
    each resumed under each of RESUMED, a killed save, what ``restore`` places and what
    ``whole_tensors`` reads. -> arrays keyed "checkpoints/..."."""
    import jax_impl
    from jax_impl import sharded_checkpoint, sharding
    from transformer_run import sharded_checkpoint as folders

    config = adam_config(MODEL)
    batches, rates = [batch_of(config)], schedule(config)
    results: dict[str, np.ndarray] = {}

    def seeded(seed: int = 0):  # a resumed run's model: other weights, all overwritten
        from transformer_spec import init_params

        return jax_impl.build_model(config, init_params(config, seed=seed, dtype="float64"))

    model = seeded()

    def whole(state, model=model):  # the whole tensors at SAVED_AT (and at the end)
        if state.step == SAVED_AT:
            results.update({f"checkpoints/reference/weight/{n}": w for n, w in jax_impl.to_params(model).items()})
            results.update({f"checkpoints/reference/moment/{n}": m for n, m in state.moments.items()})

    results["checkpoints/reference/losses"] = np.array(sharding.sharded_train(
        model, batches, STEPS, rates, plan=RESUMED[REFERENCE], checkpoint=whole, checkpoint_every=SAVED_AT
    ))  # fmt: skip
    results |= {f"checkpoints/reference/weight-end/{n}": w for n, w in jax_impl.to_params(model).items()}

    directory = {name: os.path.join(folder, "jax-sharded", name) for name in SAVED}
    for name, plan in SAVED.items():
        sharding.sharded_train(seeded(), batches, SAVED_AT, rates, plan=plan, checkpoint_dir=directory[name],
                               run_record={"plan": name})  # fmt: skip

    # a save killed after every process wrote its shards, before the commit: step-4.partial stays
    commit = folders.commit

    def killed(*args, **kwargs):
        raise KilledError

    folders.commit = killed
    try:
        sharding.sharded_train(seeded(1), batches, SAVED_AT + 1, rates, plan=SAVED[KILLED],
                               checkpoint_dir=directory[KILLED], resume=folders.read(directory[KILLED]))  # fmt: skip
    except KilledError:
        pass
    finally:
        folders.commit = commit

    for saved in SAVED:
        checkpoint = folders.read(directory[saved])  # the killed save's partial folder not among them
        params, moments = sharded_checkpoint.whole_tensors(checkpoint.folder)
        # one file, for test_jax_s_checkpoint_consolidated_resumes_in_numpy (consolidated here: Orbax and
        # TensorStore stay out of the pytest workers, whose later tests would share a process with their threads)
        folders.consolidate(directory[saved], f"{directory[saved]}.safetensors")
        results |= {f"checkpoints/{saved}/whole/weight/{n}": w for n, w in params.items()}
        results |= {f"checkpoints/{saved}/whole/moment/{n}": m for n, m in moments.items()}
        for resumed, plan in RESUMED.items():
            model, key = seeded(1), f"checkpoints/{saved}/{resumed}"
            losses = sharding.sharded_train(model, batches, STEPS, rates, plan=plan, resume=checkpoint)
            results[f"{key}/losses"] = np.array(losses)
            results |= {f"{key}/weight/{n}": w for n, w in jax_impl.to_params(model).items()}
    results |= placed(folders.read(directory["fsdp-4"]).folder)

    # NumPy's run saved under FSDP 4, consolidated into one file, resumed here under each plan
    from transformer_run.checkpoint import load_checkpoint

    from .cases import checkpoint_train

    numpy_folder = os.path.join(folder, "jax-sharded", "numpy")
    checkpoint_train(Plan(fsdp=4), SAVED_AT, checkpoint_dir=numpy_folder, checkpoint_every=SAVED_AT)
    folders.consolidate(numpy_folder, numpy_folder + ".safetensors")
    file = load_checkpoint(numpy_folder + ".safetensors")
    for resumed, plan in RESUMED.items():
        model, key = jax_impl.build_model(config, file.params), f"checkpoints/numpy/{resumed}"
        results[f"{key}/losses"] = np.array(sharding.sharded_train(model, batches, STEPS, rates, plan=plan,
                                                                    resume=file.state))  # fmt: skip
        results |= {f"{key}/weight/{n}": w for n, w in jax_impl.to_params(model).items()}
    return results


def placed(folder: str) -> dict[str, np.ndarray]:
    """``restore`` of ``folder`` into a new model and Adam under each of RESUMED: the weights and
    moments whose sharding is not their ``weight_spec`` on the plan's mesh (one name a line), and
    Adam's step."""
    from jax.sharding import NamedSharding

    import jax_impl
    from jax_impl import sharded_checkpoint, sharding
    from jax_impl.optim import Adam
    from jax_impl.params import _to_flax_name
    from jax_impl.train import _adam_moment_variables
    from transformer_spec import init_params, param_schema, parent_of

    config = adam_config(MODEL)
    results = {}
    for resumed, plan in RESUMED.items():
        mesh = sharding.sharding_mesh(plan)
        model = jax_impl.build_model(config, init_params(config, seed=1, dtype="float64"))
        optimizer = Adam(model, schedule(config))
        sharded_checkpoint.restore(folder, model, optimizer, mesh, plan)
        wrong = []
        for name, shape in param_schema(config).items():
            parent, leaf = parent_of(model, name)
            weight = getattr(parent, _to_flax_name(parent, leaf))
            m, v = _adam_moment_variables(optimizer, name)
            want = NamedSharding(mesh, sharding.weight_spec(name, tuple(shape), plan))
            for what, variable in (("weight", weight), ("m", m), ("v", v)):
                array = variable[...]
                if array.sharding.num_devices != plan.devices or not array.sharding.is_equivalent_to(want, len(shape)):
                    wrong.append(f"{what} {name}: {array.sharding}, not {want}")
        results[f"checkpoints/placed/{resumed}/misplaced"] = np.array("\n".join(wrong))
        results[f"checkpoints/placed/{resumed}/adam-step"] = np.array(
            [optimizer.t, int(optimizer.optimizer.opt_state.inner_state[0].count[...])]
        )
    return results
