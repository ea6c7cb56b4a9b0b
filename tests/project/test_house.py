"""House rules of the repository's text and files: the README's length, the design citations, one case for docs
file names, links that resolve, JSON written atomically, no scripts among the results."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests import ROOT

README_MAX_WORDS = 1200
CODE_TOPS = ("dear", "envs", "train", "eval", "simworld", "bench", "tests", "configs", "docker")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh"}


def _texts() -> list[Path]:
    """The repository's own text files: code, configs, docs and the results' READMEs (not data or traces)."""
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md"),
             *(ROOT / "results").rglob("README.md")]
    for top in CODE_TOPS:
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()]
    return sorted(set(files))


def test_the_readme_stays_short():
    """`wc -w README.md` at most 1,200: detail belongs in docs/ and results/README.md."""
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words <= README_MAX_WORDS, f"README.md has {words} words (wc -w), more than {README_MAX_WORDS}"


def test_design_citations_point_to_sections_of_docs_design():
    """Every citation of the design names its file, docs/DESIGN.md, and a section heading there."""
    sections = set(re.findall(r"^#{2,3} (\d+[a-z]?)\. ", (ROOT / "docs/DESIGN.md").read_text(encoding="utf-8"), re.M))
    assert {"3", "5", "6", "6b", "10", "11"} <= sections
    bare, unknown = [], []
    for path in _texts():
        text = path.read_text(encoding="utf-8", errors="replace")
        where = str(path.relative_to(ROOT))
        bare += [where for _ in re.finditer(r"(?<![\w./])DESIGN \u00a7", text)]  # the file unnamed
        for m in re.finditer(r"DESIGN\.md(?:\]\([^)]*\))? (§[\w§ ,and-]+)", text):
            unknown += [f"{where}: §{n}" for n in re.findall(r"§(\d+[a-z]?)", m.group(1)) if n not in sections]
    assert not bare, f"citations of the design without its file (write docs/DESIGN.md and the section): {bare}"
    assert not unknown, f"citations of sections docs/DESIGN.md does not have: {unknown}"


def test_docs_file_names_have_one_case():
    lower = [p.name for p in (ROOT / "docs").glob("*.md") if p.stem != p.stem.upper()]
    assert not lower, f"docs/*.md names are upper case (ARCHITECTURE.md): rename {lower}"


def test_relative_links_in_the_docs_resolve():
    """Every relative Markdown link of the README, docs/*.md and the results' READMEs names a file that exists."""
    broken = []
    for path in [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md"),
                 *(ROOT / "results").glob("*.md")]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
            target = target.split("#", 1)[0]
            if target and "://" not in target and not target.startswith("mailto:"):
                if not (path.parent / target).exists():
                    broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, f"links to missing files: {broken}"


def _is_json_dumps(node: ast.AST) -> bool:
    """`json.dumps(...)`, or `json.dumps(...) + "\\n"`: the whole text written is a JSON document."""
    if isinstance(node, ast.BinOp):
        node = node.left
    return isinstance(node, ast.Call) and ast.unparse(node.func) == "json.dumps"


def _bypasses_atomic(tree: ast.AST) -> list[int]:
    """Lines that write a whole JSON file without dear/atomic.py: `json.dump(obj, f)` or
    `path.write_text(json.dumps(...))`."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = ast.unparse(node.func)
            if name == "json.dump":
                lines.append(node.lineno)
            elif node.func.attr in ("write_text", "write_bytes") and node.args and _is_json_dumps(node.args[0]):
                lines.append(node.lineno)
    return lines


def test_json_files_are_written_through_dear_atomic():
    offenders = []
    for top in ("dear", "envs", "train", "eval", "simworld", "bench"):
        for path in (ROOT / top).rglob("*.py"):
            if path.name == "atomic.py":
                continue
            lines = _bypasses_atomic(ast.parse(path.read_text(encoding="utf-8")))
            offenders += [f"{path.relative_to(ROOT)}:{n}" for n in lines]
    assert not offenders, f"JSON written without dear.atomic.write_json: {offenders}"


def test_results_hold_no_scripts():
    """Code that makes a result lives in the package or bench/, not beside the numbers."""
    scripts = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*.py"))
    assert not scripts, f"scripts under results/ (move them to bench/ or the package): {scripts}"
