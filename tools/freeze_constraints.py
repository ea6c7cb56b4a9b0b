"""Write constraints.txt: the exact installed versions of every distribution DEAR pulls in (the core
dependencies and the given extras, transitively), i.e. the environment behind the committed results.

    python tools/freeze_constraints.py --extras local,ray,dev,serve > constraints.txt
    pip install torch==2.13.0 && pip install -c constraints.txt -e ".[local,ray,dev,serve]"

Only what the project needs is listed (not everything else installed on the machine).
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(root: str, extras: set[str]) -> dict[str, str]:
    """{distribution: installed version} reachable from `root[extras]` through installed requirements."""
    versions: dict[str, str] = {}
    todo: list[tuple[str, set[str]]] = [(root, extras)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        key = (canonicalize_name(name), frozenset(wanted))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency that is not installed (e.g. vllm without a GPU)
        versions[canonicalize_name(name)] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, set(req.extras)))
    return versions


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--extras", default="local,ray,dev,serve")
    a = p.parse_args(argv)
    versions = closure("dear", {e for e in a.extras.split(",") if e})
    versions.pop("dear", None)
    print(f"# pip constraints: the versions behind the committed results (python tools/freeze_constraints.py "
          f"--extras {a.extras}; Python {sys.version.split()[0]})")
    for name in sorted(versions):
        print(f"{name}=={versions[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
