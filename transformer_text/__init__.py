"""Text to token ids and back: BERT's WordPiece tokenizer, byte-level BPE (GPT-2's and SmolLM2's),
ChatML chat templates, and the Shakespeare corpus with its committed train/held-out split
(``shakespeare_split.json``).

Standard library and NumPy only: the tokenizers read their vocabulary files themselves, so the
Hugging Face libraries are needed only to check them against.
"""

from .bpe import ByteLevelBPE
from .chat_template import apply_chat_template, parse_chatml_template
from .corpus import CorpusError, load_split, perplexity, training_batches
from .tokenizer import WordPieceTokenizer

__all__ = [
    "ByteLevelBPE",
    "CorpusError",
    "WordPieceTokenizer",
    "apply_chat_template",
    "load_split",
    "parse_chatml_template",
    "perplexity",
    "training_batches",
]
