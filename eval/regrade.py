"""`python -m eval.regrade`: grade committed results again from their stored completions, then rebuild their
reports. No model is called.

    python -m eval.regrade results/eval-gsm8k-n60-v2 results/eval-math500-n30-t2048 results/eval-gpqa-n30

Each directory's traces are re-parsed with today's parser (the agent's own answer; a letter that is not an option
is no answer), grouped by today's answer equivalence and voted again (`dear.debate.regrade`). Trace files are
rewritten in place, atomically. What moved is kept in ``regrade.json`` beside them: the date, the changed turns
and final votes per trace file, and the accuracy each method's report gave before its first re-grade (read from
its ``summary.csv``), which the rebuilt report prints beside today's numbers. Running it again is a no-op apart
from the date.

Each debate is voted again by the rule its trace records. A trace written before every rule was recorded (a
last-round vote used to leave it unset) is refused, naming its file and line, unless the rule is named:
``--vote-rule RULE`` (last-round, all-answers or belief-weighted) for every such trace, ``--vote-rule METHOD=RULE``
for those of one trace file (``traces/<benchmark>/METHOD.jsonl``; it wins over a bare RULE). A trace that records
its rule keeps it; the rule used is written into the re-graded trace. A directory with a refused trace is left
as it was.

    python -m eval.regrade --vote-rule last-round --vote-rule dear=all-answers results/eval-gsm8k-n60-extended

Directories it knows:
- an `eval.run` results directory (``run.json``): every ``traces/<benchmark>/*.jsonl`` (not the regulator
  logs); its report is rebuilt by the last recorded command with ``--report-only``, and ``interventions.md``, if
  present, by the command it names;
- a layout comparison (`eval.layouts`, ``arms.jsonl`` + ``round0.jsonl``): its report is rebuilt from the records;
- a debate corpus (`simworld.corpus`, ``corpus.jsonl.gz``): the simulator fit and evidence match read it; rebuild
  them with the commands their reports name.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dear import tasks
from dear.atomic import write_json
from dear.cli import run as run_cli
from dear.debate.corpus_file import CORPUS_FILE, read_corpus
from dear.debate.engine import DECISIONS
from dear.debate.regrade import MissingVoteRule, TraceChange, change_of, regrade_trace
from dear.debate.trace import DebateTrace
from dear.integrity import atomic_write_bytes, atomic_write_text, read_json
from dear.tasks.equivalence import STATS
from dear.tasks.types import Question
from eval import interventions, layouts
from eval import run as eval_run
from eval.report import REGRADE_RECORD, moved_note, read_regrade_record

PROG = "python -m eval.regrade"


@dataclass(frozen=True)
class VoteRules:
    """The vote rules named on the command line for traces that record none (--vote-rule): `default` for every
    trace file, `by_file` for one file's (its name without .jsonl: an eval.run method, e.g. "dear")."""

    default: str | None = None
    by_file: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, values: Sequence[str] | None) -> VoteRules:
        """`["last-round", "dear=all-answers"]` -> VoteRules; ValueError for an unknown rule or a bare rule twice."""
        default, by_file = None, {}
        for value in values or []:
            name, _, rule = value.rpartition("=")
            if rule not in DECISIONS:
                raise ValueError(f"--vote-rule {value!r}: the rule must be one of {', '.join(DECISIONS)}")
            if not name:
                if default is not None and default != rule:
                    raise ValueError(f"--vote-rule names two rules for every trace: {default!r} and {rule!r}")
                default = rule
            elif by_file.setdefault(name, rule) != rule:
                raise ValueError(f"--vote-rule names two rules for {name!r}: {by_file[name]!r} and {rule!r}")
        return cls(default, by_file)

    def for_file(self, path: Path) -> str | None:
        return self.by_file.get(file_key(path), self.default)

    def to_json(self) -> dict[str, str]:
        return {**({"*": self.default} if self.default else {}), **self.by_file}


def file_key(path: Path) -> str:
    """A trace file's name in --vote-rule METHOD=RULE: its name without .jsonl (or .jsonl.gz)."""
    return path.name.removesuffix(".gz").removesuffix(".jsonl")


class QuestionIndex:
    """Questions by (task, id) over every split of a task, loaded once per task."""

    def __init__(self) -> None:
        self._by_task: dict[str, dict[str, Question]] = {}

    def get(self, task: str, question_id: str) -> Question:
        if task not in self._by_task:
            spec = tasks.get_task(task)
            index: dict[str, Question] = {}
            for split in spec.splits:
                index.update((q.id, q) for q in tasks.load(task, split=split))
            self._by_task[task] = index
        try:
            return self._by_task[task][question_id]
        except KeyError:
            raise ValueError(f"question {question_id!r} is not in task {task!r}") from None


def regrade_lines(lines: Iterable[str], engine_seed: int, questions: QuestionIndex, where: str,
                  trace_of=lambda rec: rec, put_trace=None,
                  vote_rule: str | None = None) -> tuple[list[str], list[TraceChange]]:
    """Re-graded JSON lines and their changes. `trace_of(record)` finds the trace dict inside a record and
    `put_trace(record, trace_dict)` puts the new one back (default: the record is the trace). `vote_rule` re-votes
    the traces that record no rule; without it such a trace raises MissingVoteRule naming `where` and its line."""
    out, changes = [], []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            old = DebateTrace.from_dict(trace_of(rec))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{where}:{lineno}: not a stored debate: {e}") from None
        try:
            new = regrade_trace(old, questions.get(old.task, old.question_id), engine_seed, vote_rule)
        except MissingVoteRule as e:
            raise MissingVoteRule(f"{where}:{lineno}: {e} (a trace written before every rule was recorded); name "
                                  f"it with --vote-rule {'|'.join(DECISIONS)} or --vote-rule "
                                  f"{file_key(Path(where))}=RULE") from None
        changes.append(change_of(old, new))
        rec = new.to_dict() if put_trace is None else put_trace(rec, new.to_dict())
        out.append(json.dumps(rec, ensure_ascii=False))
    return out, changes


def regrade_file(path: Path, engine_seed: int, questions: QuestionIndex, vote_rules: VoteRules = VoteRules(),
                 **kwargs) -> tuple[list[str], list[TraceChange]]:
    """One JSONL file of traces (or of records holding traces) re-graded: its new lines and changes (`write_files`
    writes them, once every file of a directory has been re-graded without a refusal)."""
    return regrade_lines(path.read_text(encoding="utf-8").splitlines(), engine_seed, questions, str(path),
                         vote_rule=vote_rules.for_file(path), **kwargs)


def write_files(regraded: dict[Path, tuple[list[str], list[TraceChange]]]) -> dict[Path, list[TraceChange]]:
    """Rewrite each re-graded file in place (atomically); returns the changes per file."""
    for path, (lines, _) in regraded.items():
        atomic_write_text(path, "".join(line + "\n" for line in lines))
    return {path: changes for path, (_, changes) in regraded.items()}


def file_summary(changes: Sequence[TraceChange]) -> dict[str, Any]:
    """What moved in one file: counts, and the debates whose final answer or its grade changed."""
    return {"debates": len(changes), "turns_changed": sum(c.turns_changed for c in changes),
            "debates_with_turns_changed": sum(c.turns_changed > 0 for c in changes),
            "finals_changed": [asdict(c) for c in changes
                               if c.old_final != c.new_final or c.old_correct != c.new_correct],
            "scores_changed": [c.question_id for c in changes  # ties as expected values
                               if c.old_score is not None and abs(c.old_score - c.new_score) > 1e-12]}


def _summary_accuracy(path: Path, columns: Sequence[str] = ("benchmark", "method"),
                      value: str = "accuracy") -> dict[str, float]:
    """{"benchmark/method": accuracy} of a summary.csv (the numbers a report published); `value="n"`: its
    question counts."""
    if not path.exists():
        return {}
    with path.open(encoding="utf-8") as f:
        return {"/".join(row[c] for c in columns): float(row[value]) for row in csv.DictReader(f)
                if row.get(value) not in (None, "")}


def write_record(root: Path, files: dict[str, dict[str, Any]], before: dict[str, float],
                 before_interventions: dict[str, float] | None = None,
                 before_n: dict[str, float] | None = None, vote_rules: VoteRules = VoteRules()) -> dict[str, Any]:
    """regrade.json: the first re-grade's `before` accuracies (of summary.csv and interventions.csv) and the
    questions each was measured on (`before_n`) are kept; each run appends its changes."""
    path = root / REGRADE_RECORD
    record = read_regrade_record(root) or {"before": before, "before_interventions": before_interventions or {},
                                           "before_n": {k: int(n) for k, n in (before_n or {}).items()},
                                           "runs": []}
    record["runs"].append({"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "files": files,
                           "math_equivalence_checks": STATS.checks, "math_equivalence_undecided": STATS.undecided,
                           **({"vote_rules": vote_rules.to_json()} if vote_rules.to_json() else {})})
    write_json(path, record, indent=1)
    return record


# ---------------------------------------------------------------- directory kinds
def eval_trace_files(root: Path) -> list[Path]:
    """An eval.run directory's trace files (not the regulator logs)."""
    return [p for p in sorted((root / "traces").glob("*/*.jsonl")) if not p.name.endswith(".regulator.jsonl")]


def regrade_eval_dir(root: Path, questions: QuestionIndex, vote_rules: VoteRules = VoteRules()) -> dict[str, Any]:
    run_json = read_json(root / "run.json", "eval.run settings")
    seed = int(run_json["settings"]["seed"])
    before = _summary_accuracy(root / "summary.csv")
    before_interventions = _summary_accuracy(root / "interventions.csv")
    before_n = _summary_accuracy(root / "summary.csv", value="n")
    changed = write_files({path: regrade_file(path, seed, questions, vote_rules) for path in eval_trace_files(root)})
    files = {str(path.relative_to(root)): file_summary(changes) for path, changes in changed.items()}
    record = write_record(root, files, before, before_interventions, before_n, vote_rules)
    rebuild_eval_reports(root, run_json)
    return record


def _with_out(argv: list[str], root: Path) -> list[str]:
    """`argv` with its `--out` value replaced by `root` (appended when absent)."""
    argv = list(argv)
    if "--out" in argv:
        argv[argv.index("--out") + 1] = str(root)
        return argv
    return [*argv, "--out", str(root)]


def rebuild_eval_reports(root: Path, run_json: dict[str, Any]) -> None:
    command = run_json["commands"][-1]
    eval_run.main([*_with_out(shlex.split(command.removeprefix("python -m eval.run ")), root), "--report-only"])
    inter = root / "interventions.md"
    if inter.exists():
        line = next(ln for ln in inter.read_text(encoding="utf-8").splitlines() if ln.startswith("Command: "))
        argv = shlex.split(line.removeprefix("Command: ").strip("`").removeprefix("python -m eval.interventions "))
        interventions.main(_with_out(argv, root))


def regrade_layout_dir(root: Path, questions: QuestionIndex, vote_rules: VoteRules = VoteRules()) -> dict[str, Any]:
    settings = read_json(root / "settings.json", "layout settings")
    seed = int(settings.get("seed", 0))
    before = _summary_accuracy(root / "summary.csv", ("arm",))

    def trace_of(rec: dict) -> dict:
        return rec["trace"]

    def put_trace(rec: dict, trace: dict) -> dict:
        return {**rec, "trace": trace}

    changed = write_files({root / "round0.jsonl": regrade_file(root / "round0.jsonl", seed, questions, vote_rules),
                           root / "arms.jsonl": regrade_file(root / "arms.jsonl", seed, questions, vote_rules,
                                                             trace_of=trace_of, put_trace=put_trace)})
    files = {path.name: file_summary(changes) for path, changes in changed.items()}
    record = write_record(root, files, before, vote_rules=vote_rules)
    rebuild_layout_report(root, settings, record)
    return record


def rebuild_layout_report(root: Path, settings: dict[str, Any], record: dict[str, Any]) -> None:
    """`eval.layouts --report-only` with the stored settings, then the "what moved" note appended."""
    flags = {"task": "--task", "split": "--split", "data_seed": "--data-seed", "seed": "--seed", "llm": "--llm",
             "n_agents": "--n-agents", "n_rounds": "--n-rounds", "max_tokens": "--max-tokens", "n_ctx": "--n-ctx",
             "parallel": "--parallel", "chunk": "--chunk", "temperature": "--temperature", "top_p": "--top-p"}
    argv = [x for k, flag in flags.items() for x in (flag, str(settings[k]))]
    layouts.main([*argv, "--out", str(root), "--report-only"])
    with (root / "summary.csv").open(encoding="utf-8") as f:
        accuracy = {row["arm"]: (float(row["accuracy"]), float("nan")) for row in csv.DictReader(f)}
    summary = root / "summary.md"
    text = summary.read_text(encoding="utf-8").rstrip("\n")
    atomic_write_text(summary, text + "\n\n" + "\n".join(moved_note(record, accuracy)))


def regrade_corpus_dir(root: Path, questions: QuestionIndex, vote_rules: VoteRules = VoteRules()) -> dict[str, Any]:
    """A debate corpus (`simworld.corpus`): every record's trace, the gzip file rewritten one member per record as
    `simworld.corpus` writes it. The fit and evidence reports built from it are rebuilt by their own commands."""
    settings = read_json(root / "settings.json", "corpus settings")
    path = root / CORPUS_FILE
    records = read_corpus(path)
    lines, changes = regrade_lines([json.dumps(r) for r in records], int(settings.get("seed", 0)), questions,
                                   str(path), trace_of=lambda rec: rec["trace"],
                                   put_trace=lambda rec, trace: {**rec, "trace": trace},
                                   vote_rule=vote_rules.for_file(path))
    atomic_write_bytes(path, b"".join(gzip.compress((line + "\n").encode("utf-8"), mtime=0) for line in lines))
    return write_record(root, {CORPUS_FILE: file_summary(changes)}, {}, vote_rules=vote_rules)


def trace_files(root: Path) -> list[Path]:
    """The trace files `regrade_dir` rewrites in `root` (ValueError for a directory it does not know)."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such results directory")
    if (root / "run.json").exists() and (root / "traces").is_dir():
        return eval_trace_files(root)
    if (root / "arms.jsonl").exists():
        return [root / "round0.jsonl", root / "arms.jsonl"]
    if (root / CORPUS_FILE).exists():
        return [root / CORPUS_FILE]
    raise ValueError(f"{root}: not an eval.run results directory (run.json + traces/), a layout comparison "
                     f"(arms.jsonl) or a debate corpus ({CORPUS_FILE})")


def regrade_dir(root: Path, questions: QuestionIndex, vote_rules: VoteRules = VoteRules()) -> dict[str, Any]:
    trace_files(root)  # a directory it knows
    if (root / "run.json").exists() and (root / "traces").is_dir():
        return regrade_eval_dir(root, questions, vote_rules)
    if (root / "arms.jsonl").exists():
        return regrade_layout_dir(root, questions, vote_rules)
    return regrade_corpus_dir(root, questions, vote_rules)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", type=Path, help="results directories (eval.run or eval.layouts)")
    p.add_argument("--vote-rule", action="append", metavar="[METHOD=]RULE",
                   help=f"the vote rule ({', '.join(DECISIONS)}) of the traces that record none, which are refused "
                        "without it: a bare RULE for every trace file, METHOD=RULE for traces/<benchmark>/METHOD.jsonl "
                        "(repeatable; a trace that records its rule keeps it)")
    a = p.parse_args(argv)
    vote_rules = VoteRules.parse(a.vote_rule)
    named = {file_key(path) for root in a.dirs for path in trace_files(root)}
    unknown = sorted(set(vote_rules.by_file) - named)
    if unknown:
        raise ValueError(f"--vote-rule names {unknown}, which no trace file of {[str(d) for d in a.dirs]} is")
    questions = QuestionIndex()
    for root in a.dirs:
        record = regrade_dir(root, questions, vote_rules)
        run = record["runs"][-1]
        turns = sum(f["turns_changed"] for f in run["files"].values())
        finals = sum(len(f["finals_changed"]) for f in run["files"].values())
        print(f"{root}: {turns} turns and {finals} final votes changed in {len(run['files'])} trace files; "
              f"report rebuilt")
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
