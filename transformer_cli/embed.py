"""``transformer-ref embed``: sentence embeddings from the real all-MiniLM-L6-v2 weights.

Tokenizes with our WordPiece tokenizer, runs our encoder in the chosen backend, and
mean-pools and normalises as sentence-transformers does. Prints each sentence's tokens,
the first values of its embedding and, for several sentences, their cosine similarities.

Examples:
  transformer-ref embed "A man is eating food." "A man is eating a meal." "The sky is blue."
  transformer-ref embed "time flies like an arrow" --backend torch --dtype float64
"""

from __future__ import annotations

import argparse

from transformer_backends.names import BACKENDS

from .errors import UsageError, get_installed_backend
from .help import plain, summary
from .threads import add_threads_argument, use_threads


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "embed", help=summary(__doc__), description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sentences", nargs="+", help="one or more sentences (quote each)")
    parser.add_argument("--backend", default="numpy", choices=BACKENDS, help="where to run it (default: numpy)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "float64"],
        help="float type (default: float32)",
    )
    add_threads_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from transformer_convert.hf_bert import load_hf_bert, minilm_directory, sentence_embedding
    from transformer_text.tokenizer import WordPieceTokenizer

    backend = get_installed_backend(args.backend)
    try:
        directory = minilm_directory()
    except ImportError as error:
        raise UsageError(f"embed reads the real all-MiniLM-L6-v2: {error}") from None
    if not all(sentence.strip() for sentence in args.sentences):
        raise UsageError(f"each sentence must hold some text, got {args.sentences!r}")
    params, config = load_hf_bert(directory)
    use_threads(args.threads, [args.backend], sum(v.size for v in params.values()))
    tokenizer = WordPieceTokenizer.from_file(directory)
    batch = tokenizer(args.sentences)
    model = backend.impl.build_model(config, params, dtype=args.dtype)
    hidden = backend.call(model, batch["ids"], batch["token_type_ids"]).last_hidden_state
    embeddings = sentence_embedding(hidden, batch["attention_mask"])  # (B, 384), unit length
    print(f"all-MiniLM-L6-v2 in {args.backend} ({args.dtype}): {config.d_model}-dimensional sentence embeddings\n")
    for row, sentence in enumerate(args.sentences):
        real = batch["attention_mask"][row].astype(bool)
        print(f"{sentence!r}")
        print(f"  tokens: {[tokenizer.inverse[int(i)] for i in batch['ids'][row][real]]}")
        print(f"  ids:    {batch['ids'][row][real].tolist()}")
        print("  embedding[:8]: " + " ".join(f"{v:+.5f}" for v in embeddings[row, :8]))
    if len(args.sentences) > 1:
        print("\ncosine similarity")
        similarity = embeddings @ embeddings.T
        for row in range(len(args.sentences)):
            print("  " + " ".join(f"{v:6.3f}" for v in similarity[row]) + f"   {args.sentences[row][:40]!r}")
    return 0
