"""One session per backend, one for all three, one for lint.

Each backend session installs only that backend (plus the NumPy reference, which is
always there) and runs the shared suite for it. pip-based virtualenvs on purpose: the
pinned torch wheel is found through pip's configuration, which uv does not read.
"""

import nox

nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "parity"]

TORCH_PIN = "torch==2.13.0"  # also pinned in pyproject.toml; repeated here so pip never resolves another


def _suite(session, extras, backends):
    session.install("-e", f".[{extras}]", *([TORCH_PIN] if "torch" in extras or "all" in extras else []))
    args = [f"--backend={b}" for b in backends]
    session.run("pytest", "shared_tests", *args, *session.posargs)


@nox.session
def numpy(session):
    """NumPy only: the reference against itself in float32 and float64, and transformer_spec."""
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
    """All three backends installed, the whole suite, then the main command."""
    _suite(session, "all,test", [])
    session.run("transformer-ref", "compare")


@nox.session
def lint(session):
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
