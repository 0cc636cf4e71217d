"""The code every backend shares to run a model: the training loop and its checkpoints, the
learning-rate schedules, batches and the toy data sets, the data-parallel split, the
mixed-precision rules, and the search (greedy, beam, sampling) over a backend's logits.

Backend-neutral (NumPy only): a backend hands in its step functions or its logits, so the three
backends cannot differ in any of this, only in what they compute.
"""

from .batches import BATCH_KEYS, decoder_only_batch, encoder_decoder_batch, split_batch
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .data import TOY_TRANSLATION_MODEL, WordVocab, copy_task, next_word_batch, translation_batch
from .data_parallel import check_data_parallel, shard, shard_weights
from .decoding import BeamResult, beam_search, filter_logits, greedy_decode, sample_decode
from .mixed_precision import COMPUTE_DTYPES, POLICIES, check_compute_dtype
from .schedules import constant_schedule, warmup_schedule
from .train import TrainingState, train_loop

__all__ = [
    "BATCH_KEYS",
    "COMPUTE_DTYPES",
    "POLICIES",
    "TOY_TRANSLATION_MODEL",
    "BeamResult",
    "Checkpoint",
    "TrainingState",
    "WordVocab",
    "beam_search",
    "check_compute_dtype",
    "check_data_parallel",
    "constant_schedule",
    "copy_task",
    "decoder_only_batch",
    "encoder_decoder_batch",
    "filter_logits",
    "greedy_decode",
    "load_checkpoint",
    "next_word_batch",
    "sample_decode",
    "save_checkpoint",
    "shard",
    "shard_weights",
    "split_batch",
    "train_loop",
    "translation_batch",
    "warmup_schedule",
]
