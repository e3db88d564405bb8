"""Benchmarks of the trainer: ``python -m bench.trainer.<name>``."""
