"""Arbiter's wire contract (v1): the pydantic models every service, the trainer and clients share.

Nothing outside ``proto/`` defines a wire model. Each module is one capability:
``common`` (base model, error envelope), ``components`` (the shape every component
service speaks), ``verify``, ``embedding``, ``judge`` (their params and extra endpoints)
and ``gateway`` (the public ``/v1/score``).
"""

API_VERSION = "v1"
