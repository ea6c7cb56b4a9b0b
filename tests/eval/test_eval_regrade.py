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
    assert record["before_n"]["gpqa_diamond/mad"] == 30  # the questions the "before" accuracy was measured on
    summary = (out / "summary.md").read_text()
    assert "what moved" in summary and "| gpqa_diamond/mad |" in summary
    assert "questions then → now" in summary and next(
        line for line in summary.splitlines() if line.startswith("| gpqa_diamond/mad |")).endswith("| 30 → 30 |")
    # the rebuilt report gives the same numbers as the committed one (everything else was already re-graded)
    assert (out / "summary.csv").read_text() == (SOURCE / "summary.csv").read_text()

    assert regrade.main([str(out)]) == 0  # again: nothing left to change, the first run's note stays
    record = json.loads((out / "regrade.json").read_text())
    assert len(record["runs"]) == 2 and sum(f["turns_changed"] for f in record["runs"][1]["files"].values()) == 0


def test_a_note_says_when_the_directory_grew_after_its_regrade():
    """A row measured on other questions now than when its "before" accuracy was published says so, instead of
    reading as a change the re-grade made; a record that did not keep the count says it is not known."""
    from eval.report import moved_note, questions_then

    run = {"date": "d", "files": {}, "math_equivalence_checks": 0, "math_equivalence_undecided": 0}
    old = {"before": {"gsm8k/cot": 0.5556}, "runs": [run]}
    assert questions_then(old, "gsm8k/cot") is None
    grown = {**old, "before_n": {"gsm8k/cot": 9}}
    assert questions_then(grown, "gsm8k/cot") == 9
    lines = moved_note(grown, {"gsm8k/cot": (0.55, 0.55), "gsm8k/sc": (0.6, 0.6)},
                       n_now={"gsm8k/cot": 60, "gsm8k/sc": 60})
    assert "| gsm8k/cot | 55.6 | 55.0 | 55.0 | 9 → 60 |" in lines and "| gsm8k/sc | – | 60.0 | 60.0 | – → 60 |" in lines
    assert "| gsm8k/cot | 55.6 | 55.0 | 55.0 | – → 60 |" in moved_note(old, {"gsm8k/cot": (0.55, 0.55)},
                                                                      n_now={"gsm8k/cot": 60})
    assert not any("→" in line for line in moved_note(old, {"gsm8k/cot": (0.55, 0.55)}))  # without n_now: as before
