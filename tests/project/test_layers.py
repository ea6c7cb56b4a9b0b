"""The floor plan (docs/DESIGN.md §11, docs/ARCHITECTURE.md): every import of project code points to a lower floor
or stays inside its own package. Checked on the source with ast, so lazy imports inside functions count too."""

import ast
from pathlib import Path

from tests import ROOT

# package or module -> floor
FLOORS = {
    "dear.vote": 0, "dear.seeds": 0, "dear.synthetic_header": 0, "dear.cli": 0,
    "dear.atomic": 0, "dear.progress": 0, "dear.llm.base": 0,  # dear.llm.base: the backend contract, below every backend
    "dear.llm": 1, "dear.tasks": 1, "dear.evidence": 1, "dear.belief": 1, "dear.metrics": 1, "dear.integrity": 1,
    "dear.confidence": 1, "dear.sandbox": 1, "dear.settings_guard": 1,
    "dear.sim": 1,
    "dear.debate": 2, "dear.policy": 2,
    "dear.regulator": 3, "dear.bank": 3, "dear.bank.store": 1, "dear.bank.backend": 2, "dear.export": 3, "dear.read_rates": 3, "dear.infer": 3, "dear.show": 3, "envs": 3,
    "train": 4, "eval": 4, "simworld": 4, "dear.serve": 4,
}
# Same-floor imports that the floor plan allows, (importer, imported) as units or modules: the export artifact is
# read by the inference API. None between the applications: eval/ and simworld/ (both floor 4) never import each
# other. The backend registry names the sim and bank backends by path (`dear.llm.registry.SIM_BACKEND`), importing
# them only when one is built, so it needs no exception.
ALLOWED_SIDEWAYS = {("dear.infer", "dear.export"), ("dear.infer", "dear.regulator"), ("envs", "dear.regulator")}
# Arrows forbidden whatever FLOORS and ALLOWED_SIDEWAYS say, (importer, imported unit): the evaluation reads fitted
# worlds (worlds/), never the fitting code, and the simulator's application never reads the evaluation harness; the
# backends and the simulated world meet only at the backend contract (`dear.llm.base`, a unit of its own).
FORBIDDEN = (("eval", "simworld"), ("simworld", "eval"), ("dear.llm", "dear.sim"), ("dear.sim", "dear.llm"))
TOPS = ("dear", "envs", "train", "eval", "simworld")


def _unit(module: str) -> str | None:
    """The floor-plan unit a dotted module belongs to (None: outside the plan, e.g. `dear` itself)."""
    for name in sorted(FLOORS, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    return None


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _allowed(module: str, target: str) -> bool:
    """A same-floor or upward import the plan allows: one listed in ALLOWED_SIDEWAYS."""
    return any(_within(module, a) and _within(target, b) for a, b in ALLOWED_SIDEWAYS)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)  # `from dear import tasks`
    return out


def test_imports_only_point_down():
    violations = []
    files = [p for top in TOPS for p in (ROOT / top).rglob("*.py")]
    assert len(files) > 40
    for path in files:
        module = _module_name(path)
        unit = _unit(module)
        if unit is None:
            continue
        for target in _imports(path, module):
            dep = _unit(target)
            if dep is None or dep == unit or _allowed(module, target):
                continue
            if FLOORS[dep] >= FLOORS[unit]:
                violations.append(f"{path.relative_to(ROOT)}: {unit} (floor {FLOORS[unit]}) imports {target} "
                                  f"(floor {FLOORS[dep]})")
    assert not violations, "\n".join(sorted(violations))


def _forbidden(module: str, targets: set[str]) -> list[str]:
    """The imports of `module` that FORBIDDEN rules out, each with its rule."""
    return sorted(f"{module} imports {t} ({a} must not import {b})" for t in targets for a, b in FORBIDDEN
                  if _within(module, a) and _unit(t) == b)


def test_forbidden_arrows_stay_absent():
    violations = [f"{p.relative_to(ROOT)}: {v}" for top in TOPS for p in (ROOT / top).rglob("*.py")
                  for v in _forbidden(_module_name(p), _imports(p, _module_name(p)))]
    assert not violations, "\n".join(violations)


def test_the_forbidden_arrows_are_caught(tmp_path):
    """A lazy import inside a function counts; the backend contract (`dear.llm.base`) stays open to dear/sim/."""
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from dear.sim.backend import SimBackend\n    from dear.llm.base import Backend\n"
                   "    import simworld.fit\n")
    assert _forbidden("dear.llm.registry", _imports(src, "dear.llm.registry")) == [
        "dear.llm.registry imports dear.sim.backend (dear.llm must not import dear.sim)",
        "dear.llm.registry imports dear.sim.backend.SimBackend (dear.llm must not import dear.sim)"]
    assert _forbidden("eval.run", _imports(src, "eval.run")) == [
        "eval.run imports simworld.fit (eval must not import simworld)"]
    assert _forbidden("dear.sim.backend", _imports(src, "dear.sim.backend")) == []


def test_the_floor_plan_covers_every_package():
    units = {_unit(_module_name(p)) for top in TOPS for p in (ROOT / top).rglob("*.py")}
    unplanned = sorted(_module_name(p) for top in ("dear",) for p in (ROOT / top).rglob("*.py")
                       if _unit(_module_name(p)) is None and p.name != "__init__.py")
    assert not unplanned, f"modules outside the floor plan: {unplanned} (add them to FLOORS and ARCHITECTURE.md)"
    assert set(FLOORS) <= units | {None}


def _module_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (function-level imports included). `from pkg import x`
    points at the submodule pkg.x when there is one, else at the package."""
    paths = {_module_name(p): p for top in TOPS for p in (ROOT / top).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        edges = set()
        for target in _imports(path, module):
            while target and target not in paths:
                target = target.rpartition(".")[0]  # `from pkg.mod import name` -> pkg.mod
            if target and target != module:
                edges.add(target)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_anywhere():
    """No two modules import each other, directly or through others, lazily or not (package __init__ files that
    re-export their submodules excepted: they import downward by construction)."""
    graph = _module_graph()
    for module in [m for m in graph if (ROOT / Path(*m.split(".")) / "__init__.py").exists()]:
        graph[module] = set()  # re-exports only
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
