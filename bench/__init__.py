"""Benchmarks: ``python -m bench.<area>``; each measures against a baseline in the same run."""
