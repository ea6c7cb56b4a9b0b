"""`python -m eval.regrade` on a copy of a committed real results directory (GPQA-Diamond, embedded model):
stored completions are parsed again, the traces rewritten, the report rebuilt with its "what moved" note."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eval import regrade

from tests import ROOT

SOURCE = ROOT / "results" / "eval-gpqa-n30"


def _turn(path: Path, line: int, rnd: int, agent: int) -> dict:
    return json.loads(path.read_text().splitlines()[line - 1])["rounds"][rnd][agent]


def test_regrade_reparses_stored_completions_and_rebuilds_the_report(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the directory's recorded command names its policy relative to the repository
    out = tmp_path / "eval-gpqa-n30"
    shutil.copytree(SOURCE, out, ignore=shutil.ignore_patterns("cache.sqlite*"))
    (out / "regrade.json").unlink()
    mad = out / "traces" / "gpqa_diamond" / "mad.jsonl"
    # Put back what the old parser recorded for line 14, round 1, agent 0: the letter E of a 4-option question.
    lines = mad.read_text().splitlines()
    trace = json.loads(lines[13])
    trace["rounds"][1][0].update(answer="E", answer_key="E")
    lines[13] = json.dumps(trace)
    mad.write_text("\n".join(lines) + "\n")

    assert regrade.main([str(out)]) == 0
    turn = _turn(mad, 14, 1, 0)
    assert turn["answer"] is None and turn["answer_key"] is None  # not an option: no answer
    record = json.loads((out / "regrade.json").read_text())
    assert record["runs"][0]["files"]["traces/gpqa_diamond/mad.jsonl"]["turns_changed"] == 1
    assert sum(f["turns_changed"] for f in record["runs"][0]["files"].values()) == 1
    summary = (out / "summary.md").read_text()
    assert "what moved" in summary and "| gpqa_diamond/mad |" in summary
    # the rebuilt report gives the same numbers as the committed one (everything else was already re-graded)
    assert (out / "summary.csv").read_text() == (SOURCE / "summary.csv").read_text()

    assert regrade.main([str(out)]) == 0  # again: nothing left to change, the first run's note stays
    record = json.loads((out / "regrade.json").read_text())
    assert len(record["runs"]) == 2 and sum(f["turns_changed"] for f in record["runs"][1]["files"].values()) == 0
