"""Arbiter command line and local process management (``arbiter up``)."""
