"""Whole models (every kind, every output field), their weights' schema and config, traces, and
JAX's own contracts."""
