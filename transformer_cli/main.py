"""``transformer-ref``: command-line entry point (subcommands live in their own modules).

A user error in any subcommand (a bad option value, a file that is not a weights file, a
missing extra) is one line on stderr and exit status 2: ``transformer_cli.errors``."""

from __future__ import annotations

from . import attention, checkpoint, compare, embed, generate, mirror, params, pitfalls, shakespeare, trace, train
from .errors import Parser, UsageError, usage_error


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
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
    checkpoint.add_parser(commands)
    shakespeare.add_parser(commands)
    trace.add_parser(commands)
    attention.add_parser(commands)
    mirror.add_parser(commands)
    params.add_parser(commands)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the subcommand, as its other errors are
        raise usage_error(
            args.command, f"unrecognized arguments: {' '.join(unknown)} (see transformer-ref {args.command} --help)"
        )
    try:
        return args.run(args)
    except UsageError as error:
        raise usage_error(args.command, str(error)) from None
