"""The contract every backend implements: the backends' names, the config, the weight schema,
seeded init, safetensors I/O, input checks, the outputs, the trace and the fused-kernel switch.

Imports NumPy and safetensors only; every backend (numpy_impl, jax_impl, torch_impl) is fed from
here, and from ``transformer_run`` for the code all three share (the training loop, the search).
"""

from .checks import WeightsError, WeightsFileError, check_params
from .config import PRESETS, Config
from .init import init_params
from .io import load_params, save_params
from .outputs import ModelOutput
from .schema import attention_to_heads, param_schema, parent_of

__all__ = [

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
