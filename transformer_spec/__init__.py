"""Backend-neutral core: the backends' names, config, weight schema, seeded init, safetensors
I/O, input checks, and the code every backend shares (the training loop, the search).

Imports NumPy and safetensors only; every backend (numpy_impl, jax_impl, torch_impl)
is fed from here.
"""

from .backends import BACKENDS
from .checks import WeightsError, WeightsFileError, check_params
from .config import PRESETS, Config
from .convert import attention_to_heads
from .init import init_params
from .io import load_params, save_params
from .outputs import ModelOutput
from .schema import param_schema, parent_of

__all__ = [
    "BACKENDS",
    "PRESETS",
    "ModelOutput",
    "attention_to_heads",
    "Config",
    "WeightsError",
    "WeightsFileError",
    "check_params",
    "init_params",
    "load_params",
    "param_schema",
    "parent_of",
    "save_params",
]
