"""Build the course: each ``notebooks/NN_*.py`` (jupytext percent format, the source) becomes
``notebooks/NN_*.ipynb``, executed top to bottom, with its outputs.

    python -m transformer_course.build              # every chapter
    python -m transformer_course.build 04_attention # one chapter (any part of its file name: 04, attention)
    python -m transformer_course.build 04 masks     # the chapters whose file name holds "04" or "masks"
    python -m transformer_course.build --no-execute # the notebooks without outputs, in seconds

Only the built ``.ipynb`` files hold outputs (they are not committed); a cell that raises
stops the build with the notebook's name, the cell and the error, and exit status 1. A built
notebook you have edited (your answers to the exercises) is kept, not overwritten, unless
you pass ``--force``: each built notebook records a hash of the cells it was built with.

The build also gives the environment's JupyterLab (the one ``jupyter lab notebooks/`` starts next)
the course's defaults, ``LAB_SETTINGS``: see ``install_lab_settings``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import time

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"

# JupyterLab's defaults for the course. fetchNews "false" (Never): without it JupyterLab's first page
# opens on a pop-up asking whether to fetch Jupyter's news from the internet, which a learner has to
# answer before the chapter; the course reads nothing from outside this machine. A learner's own
# choice in JupyterLab's settings editor still overrides it.
LAB_SETTINGS = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false"}}
# overrides.d/ holds one defaults file per package that ships some (the folder's overrides.json,
# which a person may have written, stays theirs and overrides these)
LAB_SETTINGS_FILE = pathlib.Path("overrides.d", "transformer-course.json")


def chapters(folder: pathlib.Path = NOTEBOOKS) -> list[pathlib.Path]:
    """The course's sources, in reading order (the file names start with the chapter's number)."""
    return sorted(p for p in folder.glob("[0-9][0-9]_*.py"))


def selected(words: list[str], folder: pathlib.Path = NOTEBOOKS) -> list[pathlib.Path]:
    """The chapters whose file name contains one of ``words`` (every chapter when there are none)."""
    return [p for p in chapters(folder) if not words or any(word in p.name for word in words)]


def read(source: pathlib.Path):
    """The notebook of a jupytext percent-format source, without outputs."""
    import jupytext

    return jupytext.read(source, fmt="py:percent")


def kernel_config():
    """The kernel manager's settings: the kernel's connection encrypted (CurveZMQ) where it can be.

    A kernel on plain TCP prints "Kernel is running over TCP without encryption" on stderr as it
    starts (ipykernel), once per chapter built. jupyter_client's ``KernelManager.transport_encryption``
    "auto" hands the kernel CurveZMQ keys when its kernelspec says it takes them (ipykernel's does,
    from the version that warns): nothing left to warn about. Where jupyter_client has no such
    setting, or libzmq no Curve, the connection stays plain TCP. (The other cure, ``transport="ipc"``,
    needs an absolute socket path: with the default, a relative one, the kernel binds it in its
    working directory, the notebook's folder, and the client looks for it in this process's.)"""
    import zmq
    from jupyter_client import KernelManager
    from traitlets.config import Config

    if not zmq.has("curve") or "transport_encryption" not in KernelManager.class_trait_names():
        return Config()
    return Config({"KernelManager": {"transport_encryption": "auto"}})


def execute(notebook, cwd: pathlib.Path, timeout: int = 600, env: dict[str, str] | None = None):
    """Run every cell in a fresh kernel started in ``cwd``; raises CellExecutionError on the first that raises."""
    from nbclient import NotebookClient

    saved = dict(os.environ)
    os.environ.update(env or {})  # the kernel is started with this process's environment
    try:
        where = {"metadata": {"path": str(cwd)}}
        client = NotebookClient(
            notebook, timeout=timeout, kernel_name="python3", resources=where, config=kernel_config()
        )
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


def lab_settings_dir() -> pathlib.Path | None:
    """Where ``jupyter lab``, run from this environment, reads its defaults (its application
    settings folder: JupyterLab's own default, JUPYTERLAB_DIR included); None without JupyterLab."""
    try:
        from jupyterlab.labapp import LabApp
    except ImportError:
        return None
    return pathlib.Path(LabApp().app_settings_dir)


def install_lab_settings(folder: pathlib.Path) -> pathlib.Path | None:
    """Write ``LAB_SETTINGS`` into JupyterLab's settings folder ``folder``; the file written, None if
    it already held them. ``pip install -e`` cannot put it there (an editable install leaves a
    package's data files out), so the build, the step before ``jupyter lab``, does."""
    path = folder / LAB_SETTINGS_FILE
    text = json.dumps(LAB_SETTINGS, indent=2) + "\n"
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transformer_course.build", description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", help="build only the chapters whose file name contains one of these")
    parser.add_argument("--no-execute", action="store_true", help="write the notebooks without running them")
    parser.add_argument("--force", action="store_true", help="overwrite built notebooks even where you edited them")
    parser.add_argument("--timeout", type=int, default=600, help="seconds a cell may run (default 600)")
    args = parser.parse_args(argv)
    sources = selected(args.only)
    if not sources:
        names = ", ".join(p.stem for p in chapters())
        wanted = " or ".join(args.only)
        print(f"error: no chapter's file name contains {wanted}; the chapters are {names}", file=sys.stderr)
        return 2
    folder = lab_settings_dir()
    if folder is not None:
        try:
            written = install_lab_settings(folder)
        except OSError as error:  # a JupyterLab installed where this user cannot write: it asks, as it did
            print(f"JupyterLab's course settings not written: {error}", file=sys.stderr)
        else:
            if written:
                print(f"JupyterLab: the course's settings (no news pop-up) written to {written}")
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
