"""pyproject.toml declares what the code imports: every third-party module imported anywhere under dear/, envs/,
train/ and eval/ belongs to a distribution named in the core dependencies or in an extra, and each declared
lower bound is met by what is installed here (the versions the tests ran with)."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import ROOT

PACKAGES = ("dear", "envs", "train", "eval", "simworld")


def _requirements() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"core": project["dependencies"], **project.get("optional-dependencies", {})}
    return {group: [Requirement(r) for r in reqs] for group, reqs in groups.items()}


def _imported_top_levels() -> dict[str, str]:
    """Top-level module -> one file importing it, for every absolute import in the packages."""
    found: dict[str, str] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_declared():
    declared = {canonicalize_name(r.name) for reqs in _requirements().values() for r in reqs}
    providers = metadata.packages_distributions()
    missing = []
    for module, where in sorted(_imported_top_levels().items()):
        if module in PACKAGES or module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        if not dists:
            continue  # an optional import of a package that is not installed here (e.g. vllm): checked below
        if not dists & declared:
            missing.append(f"{module} (imported in {where}, from {sorted(dists)})")
    assert not missing, "imported but not declared in pyproject.toml: " + "; ".join(missing)


def test_uninstalled_imports_are_declared_extras():
    """Modules that cannot be resolved here must be a declared optional dependency (e.g. vllm in `gpu`)."""
    optional = {canonicalize_name(r.name) for g, reqs in _requirements().items() if g != "core" for r in reqs}
    providers = metadata.packages_distributions()
    unknown = [m for m in _imported_top_levels() if m not in PACKAGES and m not in sys.stdlib_module_names
               and m != "__future__" and m not in providers]
    assert all(canonicalize_name(m) in optional for m in unknown), unknown


def test_installed_versions_meet_the_declared_bounds():
    bad = []
    for group, reqs in _requirements().items():
        for r in reqs:
            try:
                version = metadata.version(r.name)
            except metadata.PackageNotFoundError:
                continue  # an extra not installed here (gpu, bge)
            if r.specifier and not r.specifier.contains(version, prereleases=True):
                bad.append(f"{r} ({group}): installed {version}")
    assert not bad, bad
