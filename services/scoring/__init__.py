"""The scoring core the gateway and the envs service share: recipes, plan, cache lookup,
fan-out to the component services, merge and weights (``scoring.Scorer``).

No service owns it: each builds a ``ComponentClient`` and a ``Scorer`` from its own
settings (``settings.ComponentSettings``), so neither imports the other's internals.
"""
