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


def test_one_benchmark_from_two_directories_shares_its_baselines(directory, tmp_path, monkeypatch):
    """Two directories of the same questions (one stored round 0): the baselines both computed are shown once,
    a second DEAR (another label) gets its own row, and a baseline that differs is refused."""
    second = tmp_path / "second"
    shutil.copytree(directory, second)
    real_report = combine.report_source
    flipped = {"dear": "DEAR extended (sim-trained)"}

    def second_policy(source):
        results = real_report(source)
        if source.path != second:
            return results
        return [replace(r, label=flipped.get(r.method, r.label),
                        correct_by_question={q: 1.0 - c for q, c in r.correct_by_question.items()})
                if r.method in flipped else r for r in results]

    monkeypatch.setattr(combine, "report_source", second_policy)
    results = combine.main([str(directory), str(second), "--out", str(tmp_path / "all"), "--n-boot", "100"])
    assert [r.method for r in results][:3] == ["majority", "mad", "dear"]
    assert results[3].method == f"dear@{combine.policy_tag(combine.read_source(second))}"
    assert results[3].label == "DEAR extended (sim-trained)"
    md = (tmp_path / "all" / "summary.md").read_text()
    combine.main([str(directory), "--out", str(tmp_path / "one"), "--n-boot", "100"])
    alone = (tmp_path / "one" / "summary.md").read_text()
    assert md.count("| MAD |") == alone.count("| MAD |") and "| DEAR extended (sim-trained) |" in md
    assert [s["benchmarks"] for s in json.loads((tmp_path / "all" / "sources.json").read_text())] == [
        ["synthetic"], ["synthetic"]]

    flipped["mad"] = "MAD"  # the same label with other per-question results: not one round 0
    with pytest.raises(ValueError, match="method 'MAD' differs between"):
        combine.combine([directory, second], tmp_path / "refused")


def test_a_directory_gives_only_the_methods_named_after_its_colon(directory, tmp_path):
    results = combine.main([f"{directory}:majority,dear", "--out", str(tmp_path / "all"), "--n-boot", "100"])
    assert [r.method for r in results] == ["majority", "dear"]
    (source,) = json.loads((tmp_path / "all" / "sources.json").read_text())
    assert source["methods"] == ["majority", "dear"] and source["directory"] == str(directory)
    with pytest.raises(ValueError, match=r"no method 'sc' in its results \(it has majority, mad, dear\)"):
        combine.main([f"{directory}:sc", "--out", str(tmp_path / "none"), "--n-boot", "100"])
    assert combine.split_argument("results/a:b/c") == (Path("results/a:b/c"), None)


def test_another_pool_joins_with_its_pool_in_labels_and_keys(directory, tmp_path):
    """A directory of the same questions whose pool is not the first directory's: its rows name their pool, and a
    method the first pool has too keeps both rows under two keys."""
    mixed = tmp_path / "mixed"
    shutil.copytree(directory, mixed)
    stored = json.loads((mixed / "run.json").read_text())
    stored["settings"]["agent_profiles"] = ["sim:cot", "sim:cot", "sim:direct"]
    stored["commands"][-1] += " --agent-profiles sim:cot,sim:cot,sim:direct"  # as eval.run records one
    (mixed / "run.json").write_text(json.dumps(stored))
    results = combine.main([str(mixed), f"{directory}:majority,mad", "--out", str(tmp_path / "all"),
                            "--n-boot", "100"])
    by_key = {r.method: r.label for r in results}
    assert by_key["majority@pool sim:cot ×3"] == "Round-0 majority [pool sim:cot ×3]"
    assert by_key["mad@pool sim:cot ×3"] == "MAD [pool sim:cot ×3]" and by_key["mad"] == "MAD"
    md = (tmp_path / "all" / "summary.md").read_text()
    assert "| Round-0 majority [pool sim:cot ×3] |" in md and "pool sim:cot ×2, sim:direct" in md
    assert "## Per agent" in md and "Who moved to whose answer" in md  # a mixed pool's per-agent report
    assert combine.describe_pool(["a", "a", "b", "a"]) == "a ×2, b, a"

    # each re-graded source's "what moved" note holds its own rows, under its own keys (not the renamed ones)
    run = {"date": "2026-01-01 00:00 UTC", "files": {}, "math_equivalence_checks": 0, "math_equivalence_undecided": 0}
    (directory / "regrade.json").write_text(json.dumps({"before": {"synthetic/mad": 0.25}, "runs": [run]}))
    try:
        combine.main([str(mixed), f"{directory}:majority,mad", "--out", str(tmp_path / "noted"), "--n-boot", "100"])
    finally:
        (directory / "regrade.json").unlink()
    note = (tmp_path / "noted" / "summary.md").read_text().split("what moved")[1]
    rows = [line.split(" | ")[0] for line in note.splitlines() if line.startswith("| synthetic/")]
    assert rows == ["| synthetic/majority", "| synthetic/mad"]  # not the mixed pool's rows, nor a renamed key
    mad_row = next(line for line in note.splitlines() if line.startswith("| synthetic/mad |"))
    assert mad_row.startswith(f"| synthetic/mad | 25.0 | {100 * by_mad_accuracy(results):.1f} |")


def by_mad_accuracy(results) -> float:
    return next(r.summary.accuracy.mean for r in results if r.method == "mad@pool sim:cot ×3")
