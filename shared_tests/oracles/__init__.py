"""Oracles: our backends against code nobody here wrote (torch.nn, transformers,
sentence-transformers, Flax, the real SmolLM2 files). Only ``nox -s oracles`` runs this folder,
with those references installed; ``nox -s parity`` leaves it out."""
