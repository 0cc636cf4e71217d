"""Decoding: greedy and beam search on real models, cached and uncached, and the search algorithms
themselves."""
