"""Adapters that plug Arbiter's gateway into RL frameworks (TRL, verl, …).

Each module imports with the base dependencies only (pydantic, httpx, pyyaml): no
framework, torch or service extra is needed to import it.
"""
