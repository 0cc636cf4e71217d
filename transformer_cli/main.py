"""``transformer-ref``: command-line entry point (subcommands live in their own modules)."""

from __future__ import annotations

import argparse

from . import attention, compare, embed, generate, mirror, pitfalls, trace, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="transformer-ref",
        description="The Transformer in NumPy, JAX/Flax and PyTorch: run the same weights and input "
        "through every installed backend and see where they agree.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    compare.add_parser(commands)
    embed.add_parser(commands)
    generate.add_parser(commands)
    pitfalls.add_parser(commands)
    train.add_parser(commands)
    trace.add_parser(commands)
    attention.add_parser(commands)
    mirror.add_parser(commands)
    args = parser.parse_args(argv)
    return args.run(args)
