"""eval.combine: several eval.run directories in one report (sim backend), and its refusals."""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from eval import combine
from eval import run as eval_run
from tests.eval.test_eval_run_end_to_end import make_train_checkpoint


@pytest.fixture(scope="module")
def directory(tmp_path_factory) -> Path:
    """One synthetic eval.run directory (sim backend, 4 questions)."""
    root = tmp_path_factory.mktemp("combine")
    ckpt = make_train_checkpoint(root / "run")
    out = root / "synthetic"
    eval_run.main(["--checkpoint", str(ckpt), "--benchmarks", "synthetic", "--n", "4", "--llm", "sim",
                   "--methods", "majority,mad,dear", "--seed", "0", "--out", str(out), "--batch", "2",
                   "--n-boot", "100", "--no-progress"])
    return out


def test_one_directory_is_re_reported_from_its_traces(directory, tmp_path):
    results = combine.main([str(directory), "--out", str(tmp_path / "all"), "--n-boot", "100"])
    assert {r.method for r in results} == {"majority", "mad", "dear"}
    md = (tmp_path / "all" / "summary.md").read_text()
    assert md.startswith("# DEAR evaluation, combined (SYNTHETIC)") and "| synthetic acc % [95 % CI] |" in md
    assert "python -m eval.run" in md and str(directory) in md
    (source,) = json.loads((tmp_path / "all" / "sources.json").read_text())
    assert source["benchmarks"] == ["synthetic"] and source["command"].startswith("python -m eval.run ")
    assert (tmp_path / "all" / "accuracy_vs_tokens.png").exists()


def test_the_source_directories_are_not_rewritten(directory, tmp_path):
    """A run may still be writing a source directory: combining reads it and changes no byte there."""
    def state():  # a rewrite with equal bytes (same minute in the report's date) still moves the mtime
        return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in directory.rglob("*") if p.is_file()}

    before = state()
    combine.main([str(directory), "--out", str(tmp_path / "all"), "--n-boot", "100"])
    after = state()
    assert after.keys() == before.keys()
    assert [p.name for p in before if after[p] != before[p]] == []


def test_benchmarks_of_several_directories_sit_side_by_side(directory, tmp_path, monkeypatch):
    """A second directory stands in for another benchmark: its results are renamed (the sim backend answers
    only synthetic questions); the combination itself is the real code."""
    second = tmp_path / "second"
    shutil.copytree(directory, second)
    real_report = combine.report_source

    def renamed(source):
        results = real_report(source)
        return [replace(r, benchmark="other") for r in results] if source.path == second else results

    monkeypatch.setattr(combine, "report_source", renamed)
    combine.main([str(directory), str(second), "--out", str(tmp_path / "all"), "--n-boot", "100"])
    md = (tmp_path / "all" / "summary.md").read_text()
    assert "| synthetic acc % [95 % CI] | synthetic tokens/q | other acc % [95 % CI] |" in md
    with open(tmp_path / "all" / "summary.csv") as f:
        assert {row["benchmark"] for row in csv.DictReader(f)} == {"synthetic", "other"}
    assert [s["benchmarks"] for s in json.loads((tmp_path / "all" / "sources.json").read_text())] == [
        ["synthetic"], ["other"]]


def test_refusals_name_the_directory(directory, tmp_path):
    with pytest.raises(ValueError, match="listed twice"):
        combine.combine([directory, directory], tmp_path / "twice")
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    with pytest.raises(ValueError, match="'synthetic' is in both"):
        combine.combine([directory, copy], tmp_path / "both")
    real = tmp_path / "real"
    shutil.copytree(directory, real)
    stored = json.loads((real / "run.json").read_text())
    (real / "run.json").write_text(json.dumps({**stored, "synthetic": False}))
    with pytest.raises(ValueError, match="never combined"):
        combine.combine([directory, real], tmp_path / "mixed")
    with pytest.raises(ValueError, match="no run.json"):
        combine.combine([tmp_path], tmp_path / "none")
    (real / "run.json").write_text(json.dumps({**stored, "commands": []}))
    with pytest.raises(ValueError, match="'commands' is empty"):
        combine.combine([real], tmp_path / "empty")
