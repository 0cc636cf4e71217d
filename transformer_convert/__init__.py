"""Converters between other people's weights and ours: Hugging Face BERT, GPT-2, Llama and Marian
checkpoints, torch's ``nn.Transformer``, GGUF files (the real SmolLM2-135M) and the two layouts of
rotary position embedding.

Every converter reads a foreign config into a ``transformer_spec.Config`` (refusing what our model
cannot compute) and moves a state dict between the foreign names and layout and our canonical
weights (``transformer_spec.param_schema``), checking every key and shape. NumPy and safetensors only:
a framework's tensors are handed over as NumPy arrays, and the ``gguf`` package is imported only
when a GGUF file is read.
"""

from .gguf import GGUFInfo, MissingExtraError, load_gguf, read_gguf_info, smollm2_gguf_path
from .hf_bert import bert_config, from_hf_bert, load_hf_bert, minilm_directory, sentence_embedding, to_hf_bert
from .hf_gpt2 import gpt2_config, params_from_gpt2, params_to_gpt2
from .hf_llama import llama_config, params_from_llama, params_to_llama
from .hf_marian import marian_config, params_from_marian, params_to_marian
from .rope import convert_rope_layout, halves_to_interleaved, interleaved_to_halves
from .torch_transformer import from_torch_transformer, to_torch_transformer, torch_transformer_config

__all__ = [
    "GGUFInfo",
    "MissingExtraError",
    "bert_config",
    "convert_rope_layout",
    "from_hf_bert",
    "from_torch_transformer",
    "gpt2_config",
    "halves_to_interleaved",
    "interleaved_to_halves",
    "llama_config",
    "load_gguf",
    "load_hf_bert",
    "marian_config",
    "minilm_directory",
    "params_from_gpt2",
    "params_from_llama",
    "params_from_marian",
    "params_to_gpt2",
    "params_to_llama",
    "params_to_marian",
    "read_gguf_info",
    "sentence_embedding",
    "smollm2_gguf_path",
    "to_hf_bert",
    "to_torch_transformer",
    "torch_transformer_config",
]
