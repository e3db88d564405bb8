"""Benchmarks of the services: ``python -m bench.services.<name>``."""
