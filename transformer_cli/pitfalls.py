"""``transformer-ref pitfalls``: the classic Transformer mistakes, run next to this project's code.

Each pitfall runs the wrong code (as the tutorials write it) and ours on the same
small, seeded input, in every selected backend where the mistake can happen, and prints
the two results side by side. A backend whose framework is not installed is skipped,
with the reason. The same demonstrations are held to their claims by
shared_tests/repository/test_pitfalls.py, and are the data of the docs' "Pitfalls" page
(transformer_pitfalls.run_all).
"""

from __future__ import annotations

import argparse
import textwrap

import transformer_pitfalls as pitfalls
from transformer_backends import available_backends
from transformer_backends.names import BACKENDS

from .errors import UsageError
from .help import plain, summary
from .threads import add_threads_argument, use_threads


def add_parser(commands) -> None:
    names = "\n".join(f"  {p.name:<26} {p.title} [{', '.join(p.backends)}]" for p in pitfalls.REGISTRY.values())
    parser = commands.add_parser(
        "pitfalls",
        help=summary(__doc__),
        description=plain(__doc__),
        epilog=f"pitfalls [backends where the mistake can happen]:\n{names}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="the pitfalls to run (default: all of them)")
    parser.add_argument(
        "--backend",
        action="append",
        choices=BACKENDS,
        help="run in this backend only (repeatable); default: every backend, those not installed are skipped",
    )
    parser.add_argument("--list", action="store_true", help="list the pitfalls and where each can happen; run none")
    parser.add_argument("--explain", action="store_true", help="also print why each mistake is wrong")
    parser.add_argument("--code", action="store_true", help="also print the wrong code that ran, and ours")
    add_threads_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    unknown = [n for n in args.names if n not in pitfalls.REGISTRY]
    if unknown:
        raise UsageError(f"unknown pitfall(s) {unknown}; expected some of {list(pitfalls.REGISTRY)}")
    missing = [b for b in args.backend or () if b not in available_backends()]
    if missing:
        raise UsageError(f"--backend {missing[0]} is not installed: pip install -e '.[{missing[0]}]'")
    names = args.names or list(pitfalls.REGISTRY)
    if args.list:
        for name in names:
            pitfall = pitfalls.get(name)
            print(f"{pitfall.name:<26} {pitfall.title} [{', '.join(pitfall.backends)}]")
        return 0
    backends = args.backend or list(BACKENDS)
    use_threads(args.threads, [b for b in backends if b in available_backends()], 0)  # small inputs: 1 thread
    for page in pitfalls.run_all(backends, names):
        tutorials = f"tutorials: {', '.join(page['tutorials'])}; " if page["tutorials"] else ""
        print(f"\n== {page['name']}: {page['title']} ({tutorials}can happen in {', '.join(page['backends'])})")
        if args.explain:
            print(textwrap.indent(textwrap.fill(page["explanation"], 96), "   "))
        for result in page["results"]:
            print(f"   {result['backend']:<6} wrong: {result['wrong']}")
            print(f"   {'':<6} ours:  {result['ours']}")
            if args.code:
                print(textwrap.indent(result["wrong_code"], "          | ", lambda line: True))
                print(textwrap.indent(result["ours_code"], "     ours | ", lambda line: True))
        for skip in page["skipped"]:
            print(f"   {skip['backend']:<6} skipped: {skip['reason']}")
        if not page["results"] and not page["skipped"]:
            print(f"   (not run: it cannot happen in {', '.join(backends)})")
    return 0
