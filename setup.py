"""One import name, ``arbiter``, for four folders of the repository (the rest is in pyproject.toml).

``arbiter/`` is the package itself (client, CLI, framework adapters); the top-level
``services/``, ``trainer/`` and ``proto/`` are installed as ``arbiter.services``,
``arbiter.trainer`` and ``arbiter.proto``: setuptools' ``package_dir`` mapping, no links.
The subpackages are found in each folder, so a new one (``services/<name>/``) is packaged
without a change here. docs/development.md ("Packaging") says why this way.
"""

from setuptools import find_namespace_packages, setup

MAPPED = ("services", "trainer", "proto")


def found(top: str) -> list[str]:
    """``top`` and every folder below it (proto/openapi/ holds only JSON: package data)."""
    return find_namespace_packages(include=[top, f"{top}.*"], exclude=["*__pycache__*"])


packages = found("arbiter")
package_dir = {"arbiter": "arbiter"}
for top in MAPPED:
    package_dir[f"arbiter.{top}"] = top
    packages += [f"arbiter.{name}" for name in found(top)]

setup(packages=packages, package_dir=package_dir)
