"""The pitfall "float64-without-x64": float64 silently truncated to float32 without jax_enable_x64."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from .common import _error
from .registry import Demonstration, register, source


def wrong_float64_without_x64():
    import jax.numpy as jnp

    x = np.array([1.0 + 1e-12, 1.0 / 3.0])  # float64
    implicit = jnp.asarray(x)  # float32, not a word said
    explicit = jnp.asarray(x, dtype="float64")  # float32 again, with only a UserWarning
    return implicit, explicit


def ours_float64_without_x64():
    import jax_impl
    from transformer_spec import Config, init_params

    config = Config.preset("tiny")
    return jax_impl.build_model(config, init_params(config, dtype="float64"))  # refuses: TypeError naming x64


def _float64_child() -> None:
    """Runs in a fresh interpreter (see ``float64_without_x64``); prints its findings as JSON."""
    import warnings

    import jax

    jax.config.update("jax_enable_x64", False)  # JAX's default, made explicit
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        implicit, explicit = wrong_float64_without_x64()
    error_type, error = _error(ours_float64_without_x64)
    print(
        json.dumps(
            {
                "x64": bool(jax.config.jax_enable_x64),
                "requested_dtype": "float64",
                "wrong_implicit_dtype": str(implicit.dtype),
                "wrong_explicit_dtype": str(explicit.dtype),
                "wrong_warning": str(caught[0].message).split(". ")[0] if caught else "",  # its first sentence
                "input_minus_one": 1e-12,
                "wrong_minus_one": float(explicit[0]) - 1.0,
                "wrong_third_error": abs(float(explicit[1]) - 1.0 / 3.0),
                "ours_error_type": error_type,
                "ours_error": error,
            }
        )
    )


@register("float64-without-x64", "float64 silently truncated to float32 without jax_enable_x64", ("jax",))
def float64_without_x64(backend: str) -> Demonstration:
    """JAX has no float64 unless jax_enable_x64 is set at start-up. Without it, a float64 NumPy
    array becomes float32 silently, and an explicit dtype="float64" request also returns float32,
    with only a warning. A "float64" parity test then compares float32 numbers and its 1e-12
    tolerance fails for no visible reason, or a loosened tolerance hides a real bug. Ours refuses
    float64 weights without x64 with a TypeError that says what to do. (Run in a fresh
    interpreter: the flag is process-wide, and a test session has already turned it on.)"""
    root = Path(__file__).resolve().parents[1]  # the repository: transformer_pitfalls/ and jax_impl/ live there
    env = dict(
        os.environ,
        JAX_ENABLE_X64="0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    )
    done = subprocess.run(
        [sys.executable, "-c", "from transformer_pitfalls.float64_without_x64 import _float64_child; _float64_child()"],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=300,
    )
    if done.returncode != 0:
        if "ModuleNotFoundError" in done.stderr and "'jax'" in done.stderr:
            raise ModuleNotFoundError("No module named 'jax'", name="jax")
        raise RuntimeError(f"the float64 demonstration's interpreter failed:\n{done.stderr}")
    numbers = json.loads(done.stdout.strip().splitlines()[-1])
    return Demonstration(
        pitfall="float64-without-x64",
        backend=backend,
        wrong_code=source(wrong_float64_without_x64),
        ours_code=source(ours_float64_without_x64),
        wrong=(
            f"asked for float64, got {numbers['wrong_implicit_dtype']} (silently) and "
            f"{numbers['wrong_explicit_dtype']} (warning: {numbers['wrong_warning']}); "
            f"(1 + 1e-12) - 1 = {numbers['wrong_minus_one']}"
        ),
        ours=f"raises {numbers['ours_error_type']}: {numbers['ours_error']}",
        numbers=numbers,
    )
