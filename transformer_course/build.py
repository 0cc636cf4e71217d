"""Build the course: each ``notebooks/NN_*.py`` (jupytext percent format, the source) becomes
``notebooks/NN_*.ipynb``, executed top to bottom, with its outputs.

    python -m transformer_course.build              # every chapter
    python -m transformer_course.build 04 masks     # the chapters whose file name holds "04" or "masks"
    python -m transformer_course.build --no-execute # the notebooks without outputs, in seconds

Only the built ``.ipynb`` files hold outputs (they are not committed); a cell that raises
stops the build with the notebook's name, the cell and the error, and exit status 1. A built
notebook you have edited (your answers to the exercises) is kept, not overwritten, unless
you pass ``--force``: each built notebook records a hash of the cells it was built with.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import sys
import time

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"


def chapters(folder: pathlib.Path = NOTEBOOKS) -> list[pathlib.Path]:
    """The course's sources, in reading order (the file names start with the chapter's number)."""
    return sorted(p for p in folder.glob("[0-9][0-9]_*.py"))


def read(source: pathlib.Path):
    """The notebook of a jupytext percent-format source, without outputs."""
    import jupytext

    return jupytext.read(source, fmt="py:percent")


def execute(notebook, cwd: pathlib.Path, timeout: int = 600, env: dict[str, str] | None = None):
    """Run every cell in a fresh kernel started in ``cwd``; raises CellExecutionError on the first that raises."""
    from nbclient import NotebookClient

    saved = dict(os.environ)
    os.environ.update(env or {})  # the kernel is started with this process's environment
    try:
        where = {"metadata": {"path": str(cwd)}}
        client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", resources=where)
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return notebook


def _cells_hash(notebook) -> str:
    return hashlib.sha256("\x00".join(c.source for c in notebook.cells).encode()).hexdigest()


def edited(target: pathlib.Path) -> bool:
    """Whether the built notebook ``target`` holds edits made after it was built."""
    import nbformat

    if not target.exists():
        return False
    notebook = nbformat.read(target, as_version=4)
    return notebook.metadata.get("transformer_course", {}).get("cells") != _cells_hash(notebook)


def build(source: pathlib.Path, run: bool = True, timeout: int = 600) -> pathlib.Path:
    import nbformat

    notebook = read(source)
    # jupytext's own metadata pairs a notebook with its text file; a built notebook is not paired
    # (JupyterLab's jupytext extension would open the source in its place)
    notebook.metadata.pop("jupytext", None)
    notebook.metadata["transformer_course"] = {"source": source.name, "cells": _cells_hash(notebook)}
    if run:
        execute(notebook, source.parent, timeout)
    target = source.with_suffix(".ipynb")
    nbformat.write(notebook, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transformer_course.build", description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", help="build only the chapters whose file name contains one of these")
    parser.add_argument("--no-execute", action="store_true", help="write the notebooks without running them")
    parser.add_argument("--force", action="store_true", help="overwrite built notebooks even where you edited them")
    parser.add_argument("--timeout", type=int, default=600, help="seconds a cell may run (default 600)")
    args = parser.parse_args(argv)
    sources = [p for p in chapters() if not args.only or any(word in p.name for word in args.only)]
    if not sources:
        names = ", ".join(p.stem for p in chapters())
        wanted = " or ".join(args.only)
        print(f"error: no chapter's file name contains {wanted}; the chapters are {names}", file=sys.stderr)
        return 2
    from nbclient.exceptions import CellExecutionError

    for source in sources:
        start = time.perf_counter()
        if not args.force and edited(source.with_suffix(".ipynb")):
            print(f"kept {source.with_suffix('.ipynb').name}: it holds your edits (--force overwrites it)")
            continue
        try:
            target = build(source, run=not args.no_execute, timeout=args.timeout)
        except CellExecutionError as error:
            print(f"{source.name}: a cell raised:\n{error}", file=sys.stderr)
            return 1
        print(f"{target.relative_to(NOTEBOOKS.parent)}  {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
