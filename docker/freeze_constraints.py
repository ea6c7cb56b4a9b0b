"""Write the pinned versions of dear's dependency closure (for the given extras) as a pip constraints file.

    python docker/freeze_constraints.py local,ray,serve > docker/constraints.txt

It reads dear's requirements (with the extras) from pyproject.toml, walks the installed distributions'
requirements from there and prints `name==version` for every one reached, so the image installs exactly what the tests passed with here. torch is left out:
the Dockerfile installs the CPU build of the pinned torch first.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

SKIP = {"dear", "torch"}
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _own_requirements(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def closure(extras: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    todo = [(r.name, tuple(sorted(r.extras))) for r in _own_requirements(extras)]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency for another platform or Python
        if _norm(name) not in SKIP:
            pins[_norm(dist.metadata["Name"])] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, tuple(sorted(req.extras))))
    return pins


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python docker/freeze_constraints.py", description=__doc__.split("\n\n")[0])
    p.add_argument("extras", nargs="?", default="", help="comma-separated extras of dear, e.g. local,ray,serve")
    extras = [e for e in p.parse_args(argv).extras.split(",") if e]
    print(f"# pip constraints: dear[{','.join(extras)}] as installed and tested (python docker/freeze_constraints.py"
          f" {','.join(extras)}); torch is pinned in the Dockerfile")
    for name, version in sorted(closure(extras).items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
