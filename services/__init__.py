"""Arbiter's HTTP services. Each has the same shape: app.py, routes.py, scoring.py, settings.py."""
