"""Chapter 13, training: the paper's learning-rate schedule and one Adam update."""

from __future__ import annotations

import importlib

import numpy as np

from transformer_run.schedules import constant_schedule
from transformer_run.schedules import warmup_schedule as project_schedule
from transformer_run.train import TrainingState
from transformer_spec import Config

from ..check import Exercise, Mistake


# ------------------------------------------------------------------ warmup_schedule
def _schedule_cases():
    return [
        ("steps 1..40, d_model = 36, warm-up 10", {"steps": np.arange(1, 41), "d_model": 36, "warmup_steps": 10}),
        ("the paper's d_model = 512 and warm-up 4000, steps 1 to 100000",
         {"steps": np.array([1, 10, 100, 3999, 4000, 4001, 20000, 100000]), "d_model": 512, "warmup_steps": 4000}),
        ("step 0 (before the first update), d_model = 36, warm-up 4",
         {"steps": np.arange(0, 8), "d_model": 36, "warmup_steps": 4}),
    ]  # fmt: skip


def _schedule_expected(b, x):
    rate = project_schedule(x["d_model"], x["warmup_steps"])  # the one schedule every backend's Adam reads
    return np.array([rate(int(step)) for step in x["steps"]], dtype=np.float64)


def _formula(steps, d_model, warmup_steps, exponent_on_step=False, larger=False):
    steps = np.asarray(steps, dtype=np.float64)
    with np.errstate(divide="ignore"):
        decay = steps**-0.5
        warm = steps**-1.5 * warmup_steps if exponent_on_step else steps * warmup_steps**-1.5
    return d_model**-0.5 * (np.maximum(decay, warm) if larger else np.minimum(decay, warm))


# ------------------------------------------------------------------ adam_step
def _adam_cases():
    rng = np.random.default_rng(30)

    def moments(scale: float, t: int, beta1: float, beta2: float) -> tuple[np.ndarray, np.ndarray]:
        """The moments after t updates with gradients of about ``scale``, from zero, as Adam keeps them."""
        m, v = np.zeros(6), np.zeros(6)
        for _ in range(t):
            g = scale * rng.standard_normal(6)
            m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
        return m, v

    def case(scale: float, t: int, lr: float, beta1: float = 0.9, beta2: float = 0.98, eps: float = 1e-9) -> dict:
        m, v = moments(scale, t - 1, beta1, beta2)  # the paper's betas and eps unless given
        return {"param": rng.standard_normal(6), "grad": scale * rng.standard_normal(6), "m": m, "v": v, "t": t,
                "lr": lr, "beta1": beta1, "beta2": beta2, "eps": eps}  # fmt: skip

    return [
        ("the first update (t = 1, m = v = 0)", case(1.0, 1, 1e-3)),
        ("update t = 5, with the moments of four earlier updates", case(0.5, 5, 3e-3)),
        ("gradients of about 1e-7, where eps = 1e-9 matters, t = 3", case(1e-7, 3, 1e-2)),
        ("torch's and optax's defaults: betas (0.9, 0.999), eps = 1e-8; gradients of about 1e-6, t = 4",
         case(1e-6, 4, 1e-3, 0.9, 0.999, 1e-8)),
        ("betas (0.8, 0.95), eps = 1e-6, t = 2", case(0.3, 2, 5e-3, 0.8, 0.95, 1e-6)),
    ]


def _adam_expected(b, x):
    """Each backend's own Adam (NumPy's written out, torch.optim.Adam, optax.adam) on a LayerNorm whose one
    weight is ``param``, put where it stands after t - 1 updates, then stepped once with ``grad``."""
    config = Config.preset("tiny").replace(d_model=x["param"].size, num_heads=1, bias=False)
    model = b.build("LayerNorm", config, {"weight": x["param"]}, "float64")
    optimizer = b.impl.Adam(model, constant_schedule(x["lr"]), (x["beta1"], x["beta2"]), x["eps"])
    train = importlib.import_module(f"{b.impl.__name__}.train")  # the backend's checkpoint and resume code
    moments = {"m.weight": x["m"], "v.weight": x["v"]}
    before = TrainingState(x["t"] - 1, [], moments, train.dropout_streams(model))  # (streams in its own form)
    train.restore_training_state(model, optimizer, before)
    if b.name == "numpy":
        optimizer.step({"weight": x["grad"]})
    elif b.name == "torch":
        model.weight.grad = b.asarray(x["grad"])  # what loss.backward() leaves
        optimizer.step()
    else:  # JAX: the gradients as an nnx.State shaped like the model's Params
        from flax import nnx

        grads = b.build("LayerNorm", config, {"weight": x["grad"]}, "float64")
        optimizer.step(nnx.state(grads, nnx.Param))
    after = train.training_state(model, optimizer, [])
    return np.stack([b.impl.to_params(model)["weight"], after.moments["m.weight"], after.moments["v.weight"]])


def _adam(param, grad, m, v, t, lr, beta1, beta2, eps, correct=True, eps_inside=False):
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    m_hat, v_hat = (m / (1 - beta1**t), v / (1 - beta2**t)) if correct else (m, v)
    step = m_hat / np.sqrt(v_hat + eps) if eps_inside else m_hat / (np.sqrt(v_hat) + eps)
    return param - lr * step, m, v


EXERCISES = [
    Exercise(
        name="warmup_schedule",
        chapter="13_training",
        task="warmup_schedule(steps, d_model, warmup_steps) -> (N,) float64, the learning rate at each of the N "
        "integer steps: d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (the paper's section 5.3), the "
        "steps counted from 1, and step 0 given step 1's rate. The schedule lives in transformer_run (every "
        "backend's Adam reads the same function), so each backend's answer is transformer_run's.",
        cases=_schedule_cases,
        expected=_schedule_expected,
        mistakes=(
            Mistake(
                "the steps counted from 0",
                "the first update is step 1, and its rate is the formula at 1. Shifting the count (the formula at "
                "step + 1) gives every step the next one's rate; torch's LambdaLR calls the schedule with 0 "
                "before the first step, which is why torch_impl's Adam passes it t + 1.",
                lambda steps, d_model, warmup_steps: _formula(np.asarray(steps) + 1, d_model, warmup_steps),
            ),
            Mistake(
                "the exponent -1.5 on the step",
                "the warm-up branch is linear in the step: step * warmup_steps^-1.5. step^-1.5 * warmup_steps "
                "falls with the step instead, so the rate starts huge and never warms up.",
                lambda steps, d_model, warmup_steps: _formula(steps, d_model, warmup_steps, exponent_on_step=True),
            ),
            Mistake(
                "max instead of min",
                "the rate is the *smaller* of the two branches: the linear warm-up while step < warmup_steps, the "
                "inverse square root after. The larger one is the decay branch's 1 / sqrt(step) from the start.",
                lambda steps, d_model, warmup_steps: _formula(steps, d_model, warmup_steps, larger=True),
            ),
            Mistake(
                "step 0 not handled",
                "at step 0 the formula divides by zero: 0^-0.5 is infinite (NumPy warns, Python raises "
                "ZeroDivisionError), and min(inf, 0) is a rate of 0. The project clamps the step to at least 1, "
                "max(step, 1), so that step 0 gets the first update's rate.",
                _formula,
            ),
        ),
    ),
    Exercise(
        name="adam_step",
        chapter="13_training",
        task="adam_step(param, grad, m, v, t, lr, beta1, beta2, eps) -> (param, m, v) after update t (t = 1 for "
        "the first): m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, m_hat = m / (1 - b1^t), v_hat = v / "
        "(1 - b2^t), param - lr * m_hat / (sqrt(v_hat) + eps). The arrays all have one shape; m and v come in "
        "as they stand after update t - 1. Checked against each backend's own Adam (NumPy's written out, "
        "torch.optim.Adam, optax.adam), put where it stands after t - 1 updates and stepped once.",
        cases=_adam_cases,
        expected=_adam_expected,
        mistakes=(
            Mistake(
                "no bias correction",
                "m and v start at 0, so their first values are (1 - b1) g and (1 - b2) g^2: far too small. "
                "Divide by 1 - b1^t and 1 - b2^t (t counted from 1). Without it the first update is "
                "(1 - b1) / sqrt(1 - b2) = 0.71 times Adam's, and the early updates stay off until b1^t and "
                "b2^t are near 0 (with b2 = 0.98, a few hundred steps).",
                lambda param, grad, m, v, t, lr, beta1, beta2, eps: _adam(param, grad, m, v, t, lr, beta1, beta2,
                                                                          eps, correct=False),
            ),
            Mistake(
                "eps inside the square root",
                "Adam adds eps to sqrt(v_hat), not to v_hat under the root (torch.optim.Adam and optax.adam "
                "agree). With the paper's eps = 1e-9, sqrt(v_hat + eps) is at least 3e-5: a gradient of 1e-7 "
                "then moves its weight 300 times less than Adam does.",
                lambda param, grad, m, v, t, lr, beta1, beta2, eps: _adam(param, grad, m, v, t, lr, beta1, beta2,
                                                                          eps, eps_inside=True),
            ),
        ),
    ),
]
