"""Print the requirements of the project's extras, read from pyproject.toml, with the
project's references to its own extras expanded: each image installs them in a layer of its
own, before the project's wheel, so a change to the sources rebuilds only that last layer.

    python deps.py pyproject.toml EXTRA... [--base] > requirements.txt

``--base``: also the project's own dependencies. Standard library only (it runs in the
image's Python before anything is installed).
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterator


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: str, extras: list[str], base: bool) -> list[str]:
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    own = _norm(project["name"])
    optional = project.get("optional-dependencies", {})
    seen: set[str] = set()

    def expand(extra: str) -> Iterator[str]:
        if extra in seen:
            return
        seen.add(extra)
        for req in optional[extra]:
            m = re.match(r"^([A-Za-z0-9._-]+)\[([\w,.-]+)\]$", req.replace(" ", ""))
            if m and _norm(m.group(1)) == own:
                for inner in m.group(2).split(","):
                    yield from expand(inner)
            else:
                yield req

    out = list(project.get("dependencies", [])) if base else []
    for extra in extras:
        out.extend(expand(extra))
    return list(dict.fromkeys(out))


def main() -> None:
    args = sys.argv[1:]
    base = "--base" in args
    args = [a for a in args if a != "--base"]
    print("\n".join(requirements(args[0], args[1:], base)))


if __name__ == "__main__":
    main()
