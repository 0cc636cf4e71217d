"""Checks of the repository rather than of the Transformer: the README and its numbers, the docs
site, the backends mirroring each other, the package layers, the pitfalls, the plots and the
suite itself."""
