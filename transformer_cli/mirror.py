"""``transformer-ref mirror``: where the backends' source differs, statement by statement, and why.

For every module file present in numpy_impl/, jax_impl/ and torch_impl/, functions and
methods are paired by name (a NumPy/JAX ``__call__`` with a torch ``forward``), framework
tokens are normalised (np./jnp./torch., axis/dim, keepdims/keepdim, ...: the table at the
top of transformer_mirror/mirror.py) and the statements compared. Prints a
table per file (differing statements per pair of backends, and how many have no reason),
then every difference: ``file:line  statement  -> reason``. A reason comes from a
``# differs: <reason-id>`` comment on the line, and is one of
``transformer_mirror.differences.REASONS``. NumPy's hand-written backward has no torch
counterpart and is listed apart.

Exit status 1 when a difference has no reason, or a marker names an unknown reason or
marks no difference.

Examples:
  transformer-ref mirror                      # both pairs, every file
  transformer-ref mirror --pair jax-torch --json mirror.json
  transformer-ref mirror --root /tmp/old-checkout
"""

from __future__ import annotations

import argparse
import json
import pathlib

from transformer_mirror.differences import NUMPY_BACKWARD, ONE_BACKEND_FILES, PER_BACKEND_FILES, REASONS
from transformer_mirror.mirror import PACKAGES, PAIRS, ROOT, Report, mirror_report

from .errors import UsageError, usage_error
from .help import plain, summary

NO_REASON = "NO REASON"


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "mirror",
        help=summary(__doc__),
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--pair",
        default="all",
        choices=[*PAIRS, "all"],
        help="which pair of backends to compare: JAX against torch, the NumPy forward against torch, or both "
        "(default: all)",
    )
    parser.add_argument("--json", type=pathlib.Path, metavar="PATH", help="also write the whole report to PATH as JSON")
    parser.add_argument(
        "--root",
        type=pathlib.Path,
        default=ROOT,
        metavar="DIR",
        help="the checkout to read (a folder holding numpy_impl/, jax_impl/ and torch_impl/; default: this one)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    missing = [p for p in PACKAGES.values() if not (args.root / p).is_dir()]
    if missing:  # printed as every user error is, and returned: 0, 1 and 2 are this report's statuses
        usage_error("mirror", f"--root {args.root} has no {', '.join(missing)}: --root must be a checkout")
        return 2
    if args.json and not args.json.parent.is_dir():
        raise UsageError(f"--json {args.json}: the folder {args.json.parent} does not exist")
    if args.json and args.json.is_dir():
        raise UsageError(f"--json {args.json} is a folder: give a file name")
    pairs = list(PAIRS) if args.pair == "all" else [args.pair]
    report = mirror_report(args.root, pairs)
    print_report(report, pairs)
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
        print(f"\nwrote {args.json}")
    failed = [report.unexplained(p) for p in pairs]
    return 1 if any(failed) or report.unknown_markers or report.unused_markers else 0


def print_report(report: Report, pairs: list[str]) -> None:
    print(f"Differing statements once framework tokens are normalised, in {report.root}")
    print("(per pair: all of them, and those without a reason in parentheses)\n")
    heads = "".join(f"{pair:>22}" for pair in pairs)
    print(f"{'file':<18}{heads}")
    for file in report.files:
        cells = "".join(_cell(report.count(p, file), report.count(p, file, explained=False)) for p in pairs)
        print(f"{file:<18}{cells}")
    totals = "".join(_cell(report.count(p), report.count(p, explained=False)) for p in pairs)
    print(f"{'total':<18}{totals}")
    if "numpy-torch" in pairs and report.numpy_backward:
        count = sum(len(names) for names in report.numpy_backward.values())
        print(f"\nNot compared: {count} NumPy backward functions in {len(report.numpy_backward)} files")
        print(f"  -> {NUMPY_BACKWARD}: {REASONS[NUMPY_BACKWARD]}")
        for file, names in report.numpy_backward.items():
            print(f"  {file}: {', '.join(names)}")
    for file, reason in PER_BACKEND_FILES.items():
        print(f"\nNot compared: {file} in every backend -> {reason}: {REASONS[reason]}")
    for path, reason in ONE_BACKEND_FILES.items():
        print(f"\nIn one backend only: {path} -> {reason}: {REASONS[reason]}")
    for pair in pairs:
        differences = report.of(pair)
        print(f"\n== {pair}: {len(differences)} differences, {report.count(pair)} statements")
        for difference in differences:
            reason = ", ".join(difference.reasons) or NO_REASON
            print(f"-- {difference.file} {difference.function}")
            for path, side in ((difference.left_path, difference.left), (difference.right_path, difference.right)):
                for statement in side:
                    where = f"{path}:{statement.line}"
                    print(f"   {where:<30} {_first_line(statement.source):<80} -> {reason}")
    for title, markers in (("unknown reason", report.unknown_markers), ("marks no difference", report.unused_markers)):
        for path, line, reason in markers:
            print(f"{path}:{line}: '# differs: {reason}': {title}")


def _cell(total: int, unexplained: int) -> str:
    return f"{total:>16} ({unexplained:>3})" if total else f"{'-':>16}{'':6}"


def _first_line(source: str) -> str:
    first = source.splitlines()[0] if source else ""
    return first if len(first) <= 80 else first[:77] + "..."
