"""Verify service: ``math_accuracy`` (math-verify in a process pool) and ``format``."""
