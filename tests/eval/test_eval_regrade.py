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

    # its traces were written before every vote rule was recorded: every method there votes over its last round
    assert regrade.main(["--vote-rule", "last-round", str(out)]) == 0
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

    assert json.loads(mad.read_text().splitlines()[0])["decision"] == "last-round"  # the rule used, now recorded
    assert regrade.main([str(out)]) == 0  # again, no rule named: each trace records its own; nothing changes
    record = json.loads((out / "regrade.json").read_text())
    assert len(record["runs"]) == 2 and sum(f["turns_changed"] for f in record["runs"][1]["files"].values()) == 0
    assert record["runs"][0]["vote_rules"] == {"*": "last-round"} and "vote_rules" not in record["runs"][1]


def _old_trace_dir(tmp_path: Path, lines: int = 2) -> tuple[Path, Path]:
    """A copy of the committed GPQA directory cut to its first `lines` questions' MAD traces (written before every
    vote rule was recorded: no `decision`)."""
    out = tmp_path / "eval-gpqa-n30"
    (out / "traces" / "gpqa_diamond").mkdir(parents=True)
    shutil.copy(SOURCE / "run.json", out / "run.json")
    mad = out / "traces" / "gpqa_diamond" / "mad.jsonl"
    mad.write_text("".join(line + "\n" for line in
                           (SOURCE / "traces" / "gpqa_diamond" / "mad.jsonl").read_text().splitlines()[:lines]))
    assert all("decision" not in json.loads(x) for x in mad.read_text().splitlines())
    return out, mad


def test_a_trace_without_a_vote_rule_is_refused_unless_the_rule_is_named(tmp_path, capsys):
    """The re-grade never guesses an old trace's vote rule: it names the file, the line and the flag, and rewrites
    nothing; `--vote-rule` (for every file, or METHOD=RULE for one) names it, and the re-graded trace records it."""
    import pytest

    from dear.cli import exit_code
    from dear.debate.regrade import MissingVoteRule

    out, mad = _old_trace_dir(tmp_path)
    before = mad.read_text()
    with pytest.raises(MissingVoteRule) as e:
        regrade.regrade_dir(out, regrade.QuestionIndex())
    message = str(e.value)
    assert f"{mad}:1: debate " in message and "records no vote rule" in message and "\n" not in message
    assert "--vote-rule last-round|all-answers|belief-weighted" in message and "--vote-rule mad=RULE" in message
    assert mad.read_text() == before and not (out / "regrade.json").exists()  # nothing rewritten
    # on the command line: one line on stderr, exit status 2
    assert exit_code(lambda: regrade.main([str(out)]), regrade.PROG, argv=[str(out)]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0

    lines, _ = regrade.regrade_file(mad, 0, regrade.QuestionIndex(), regrade.VoteRules.parse(["mad=last-round"]))
    assert [json.loads(x)["decision"] for x in lines] == ["last-round"] * 2
    # a rule named for another file does not apply; an unknown file or rule is refused before anything is read
    with pytest.raises(MissingVoteRule, match="mad.jsonl:1"):
        regrade.regrade_file(mad, 0, regrade.QuestionIndex(), regrade.VoteRules.parse(["sc=last-round"]))
    with pytest.raises(ValueError, match="which no trace file"):
        regrade.main(["--vote-rule", "dera=all-answers", str(out)])
    with pytest.raises(ValueError, match="the rule must be one of"):
        regrade.main(["--vote-rule", "guess", str(out)])
    assert mad.read_text() == before


def test_a_trace_that_records_its_rule_keeps_it_whatever_is_named(tmp_path):
    out, mad = _old_trace_dir(tmp_path, lines=1)
    trace = json.loads(mad.read_text())
    trace["decision"] = "last-round"
    mad.write_text(json.dumps(trace) + "\n")
    (line,), _ = regrade.regrade_file(mad, 0, regrade.QuestionIndex(), regrade.VoteRules.parse(["all-answers"]))
    assert json.loads(line)["decision"] == "last-round"
    assert json.loads(line)["vote_counts"] == trace["vote_counts"]


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
