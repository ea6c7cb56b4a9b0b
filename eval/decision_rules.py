"""The final decision rules on stored debates: each finished trace voted again under every rule of
`dear.debate.engine.DECISIONS` but the confidence-weighted one (`RULES`), with paired differences against the paper's last-round plurality.

    python -m eval.decision_rules --traces results/corpus-gsm8k,results/eval-gsm8k-n60-v2/traces/gsm8k/mad.jsonl \\
        --out results/decision-rules

A rule changes only which answers vote and how much each weighs, never what the agents said, so re-voting stored
debates measures it exactly, with no model call: last-round (the paper's), all-answers (every distinct sample),
belief-weighted (every distinct sample weighted by its agent's certainty 1 - u_i in its round, from the same
encoder and evidence the regulator uses; dear.regulator.CertaintyWeigher). Choose a rule on training-split debates
(the corpus) and confirm it on test traces.

`--traces` takes eval.run trace files (`OUT/traces/<benchmark>/<method>.jsonl`) or corpus directories
(`results/corpus-*`), comma-separated. `OUT/summary.md` and `rows.csv` give, per source, each rule's accuracy
(ties as expected values) with a bootstrap 95 % CI and its paired difference to last-round; `per_debate.csv` each
debate's scores. Failed debates are left out and counted.
"""

from __future__ import annotations

import argparse
import csv
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dear import metrics
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.debate.corpus_file import CORPUS_FILE, read_corpus
from dear.debate.engine import DECISIONS, Debate, vote_seed_of
from dear.debate.trace import DebateTrace, read_jsonl
from dear.evidence import make_encoder
from dear.regulator import CertaintyWeigher
from dear.tasks.types import Question

log = logging.getLogger(__name__)
PROG = "python -m eval.decision_rules"
BASE_RULE = "last-round"
# The rules re-voted: every one of DECISIONS but the confidence-weighted vote, which needs log-probabilities the stored
# debates did not ask for and a temperature fitted on training samples (eval.bank_replay reports it on sample banks)
RULES = tuple(r for r in DECISIONS if r != "confidence-weighted")


@dataclass(frozen=True)
class TraceSource:
    """One set of stored debates: a trace file or a corpus directory."""

    name: str
    traces: list[DebateTrace]


@dataclass(frozen=True)
class RuleRow:
    """One rule on one source: accuracy and its paired difference to last-round, over the same debates."""

    source: str
    rule: str
    n: int
    failed: int
    accuracy: metrics.CI
    minus_last_round: metrics.CI


def read_source(path: Path) -> TraceSource:
    """A corpus directory (its `corpus.jsonl.gz`) or an eval.run trace file."""
    if path.is_dir():
        if not (path / CORPUS_FILE).exists():
            raise FileNotFoundError(f"--traces: {path} is a directory without {CORPUS_FILE}")
        return TraceSource(str(path), [DebateTrace.from_dict(rec["trace"]) for rec in read_corpus(path / CORPUS_FILE)])
    if not path.exists():
        raise FileNotFoundError(f"--traces: no such file {path}")
    return TraceSource(str(path), read_jsonl(path))


def as_debate(trace: DebateTrace) -> Debate:
    """A finished stored debate in the engine's form, so it votes exactly as the engine does (keys stored
    canonical; the tie pick's seed as eval.run's engine, seed 0)."""
    q = Question(id=trace.question_id, task=trace.task, question=trace.question, gold=trace.gold, kind=trace.kind)
    n_rounds = max(len(trace.rounds) - 1, 0)
    return Debate(question=q, debate_id=trace.debate_id, seed=trace.seed, n_rounds=n_rounds, trace=trace,
                  vote_seed=vote_seed_of(0, trace.seed), round=n_rounds, finished=True)


def rule_scores(debates: Sequence[Debate], weigher: CertaintyWeigher) -> dict[str, list[float]]:
    """Each rule's score (ties as expected values) per debate."""
    weigher(debates)
    return {rule: [d.vote(rule).score for d in debates] for rule in RULES}


def compare(source: TraceSource, weigher: CertaintyWeigher, seed: int = 0) -> tuple[list[RuleRow], list[dict]]:
    """Every rule on the source's finished debates: rows for the table and per-debate scores."""
    kept = [t for t in source.traces if not t.failed and t.rounds]
    failed = len(source.traces) - len(kept)
    if not kept:
        raise ValueError(f"{source.name}: no finished debates")
    debates = [as_debate(t) for t in kept]
    scores = rule_scores(debates, weigher)
    rows = [RuleRow(source.name, rule, len(kept), failed, metrics.bootstrap_ci(s, seed=seed),
                    metrics.paired_bootstrap_diff(s, scores[BASE_RULE], seed=seed))
            for rule, s in scores.items()]
    per_debate = [{"source": source.name, "debate_id": d.debate_id, **{r: scores[r][k] for r in RULES}}
                  for k, d in enumerate(debates)]
    return rows, per_debate


def _pct(ci: metrics.CI, signed: bool = False) -> str:
    fmt = "{:+.1f}" if signed else "{:.1f}"
    return f"{fmt.format(100 * ci.mean)} [{fmt.format(100 * ci.low)}, {fmt.format(100 * ci.high)}]"


def write_report(out: Path, rows: Sequence[RuleRow], per_debate: Sequence[dict], command: str,
                 encoder: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Final decision rules on stored debates", "",
             f"Command: `{command}`", "",
             f"Each finished debate voted again under every rule (no model call; certainties from `{encoder}`). "
             "Accuracy counts a tied vote as its expected value; 95 % intervals are bootstrap over debates "
             "(seed 0), the difference paired on the same debates.", "",
             "| source | rule | debates | accuracy % [95 % CI] | − last-round, points [95 % CI] |",
             "|---|---|---:|---|---|"]
    for r in rows:
        failed = f" ({r.failed} failed, left out)" if r.failed else ""
        lines.append(f"| {r.source} | {r.rule} | {r.n}{failed} | {_pct(r.accuracy)} | "
                     f"{_pct(r.minus_last_round, signed=True)} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(out / "rows.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["source", "rule", "n", "failed", "accuracy", "acc_ci_low", "acc_ci_high",
                    "minus_last_round", "diff_ci_low", "diff_ci_high"])
        for r in rows:
            w.writerow([r.source, r.rule, r.n, r.failed, r.accuracy.mean, r.accuracy.low, r.accuracy.high,
                        r.minus_last_round.mean, r.minus_last_round.low, r.minus_last_round.high])
    with open(out / "per_debate.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["source", "debate_id", *RULES])
        w.writeheader()
        w.writerows(per_debate)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", required=True,
                   help="comma-separated eval.run trace files or corpus directories")
    p.add_argument("--out", required=True, type=Path, help="output directory (summary.md, rows.csv, per_debate.csv)")
    p.add_argument("--encoder", default="minilm", help="encoder of the certainties (the regulator's; default minilm)")
    p.add_argument("--answer-aware", type=float, default=0.0,
                   help="weight of parsed-answer agreement in e_ij, as the policy's (default 0: the paper's)")
    a = p.parse_args(argv)
    paths = [Path(s.strip()) for s in a.traces.split(",") if s.strip()]
    if not paths:
        p.error("--traces: no path given")
    weigher = CertaintyWeigher(make_encoder(a.encoder), a.answer_aware)
    rows: list[RuleRow] = []
    per_debate: list[dict] = []
    for path in paths:
        r, d = compare(read_source(path), weigher)
        rows += r
        per_debate += d
        log.info("%s: %d debates", path, r[0].n)
    write_report(a.out, rows, per_debate, command_line(PROG, argv), a.encoder)
    print((a.out / "summary.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
