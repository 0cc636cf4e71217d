"""Gradients (hand-written backward against finite differences, every backend against NumPy's) and
training: loss curves, dropout, mixed precision, data parallel, checkpoints, real text."""
