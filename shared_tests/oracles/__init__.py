"""Oracles: our backends against code nobody here wrote (torch.nn, transformers,
sentence-transformers, Flax, the real SmolLM2 files). Only ``nox -s oracles`` runs this folder,
with those references installed; ``nox -s parity`` leaves it out. It also holds
one check of our own code too slow for the parity session: an Adam step of the paper's base model at
full size."""
