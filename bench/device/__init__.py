"""Benchmarks of the device: ``python -m bench.device.<name>``."""
