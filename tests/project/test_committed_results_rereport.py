"""Committed learning-check directories still resume with today's code and re-report the same tables (only the
"Command:" line, which names the output directory, may differ)."""

from __future__ import annotations

import shutil

import pytest

from tests import ROOT
from train.learning_check import main

SUITES = [
    ("learning-suite", ["--seeds", "1,2,3", "run.iterations=100"], ["fitted"]),
    # measured before the learning rates were annealed by default
    ("learning-suite-extended", ["--seeds", "1", "run.iterations=100", "env.actions=extended",
                                 "env.decision=all-answers", "happo.anneal_lr=false", "happo.obs_norm=true",
                                 "happo.behavior_ratio=joint"], ["fitted", "stylised"]),
]


def without_command(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("Command:")]


@pytest.mark.parametrize("name, args, worlds", SUITES, ids=[s[0] for s in SUITES])
def test_a_committed_suite_re_reports_identically(tmp_path, name, args, worlds):
    src = ROOT / "results" / name
    out = tmp_path / name
    for world in worlds:  # the rows and settings are what a resume reads; the runs' metrics draw the curves
        shutil.copytree(src / world, out / world, ignore=shutil.ignore_patterns("checkpoints"))
    assert main(["--worlds", ",".join(worlds), "--out", str(out), *args]) == 0
    for world in worlds:
        assert without_command((out / world / "table.md").read_text()) == \
            without_command((src / world / "table.md").read_text())


EVAL_DIRS = ["eval-gsm8k-n60-v2", "eval-math500-n30-t2048", "eval-gpqa-n30", "eval-math500-n30-extended",
            "eval-gsm8k-n60-extended", "eval-gpqa-n30-extended"]


@pytest.mark.parametrize("name", EVAL_DIRS)
def test_a_committed_evaluation_re_reports_identically(tmp_path, name, monkeypatch):
    """`eval.run --report-only` with the directory's own last command rebuilds the same summary (the run date
    line excepted) from the stored traces: no model is loaded."""
    import json
    import shlex

    from eval.run import main as eval_main

    src = ROOT / "results" / name
    out = tmp_path / name
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("cache.sqlite*"))
    argv = shlex.split(json.loads((src / "run.json").read_text())["commands"][-1])[3:]  # after python -m eval.run
    argv[argv.index("--out") + 1] = str(out)
    monkeypatch.chdir(ROOT)  # the stored command's relative paths (checkpoint, cache) are the repository's
    eval_main([*argv, "--report-only"])

    def lines(path):
        return [x for x in path.read_text().splitlines() if not x.startswith("- **Date:**")]

    assert lines(out / "summary.md") == lines(src / "summary.md")
