"""DRIFTJudge on stored debates: a verdict on every (round r-1, round r) pair of finished traces, scored against
the FOCUS drift labels.

    python -m eval.judge_offline --traces results/corpus-gsm8k --llm local --prompt verify-cot \\
        --out results/judge-gsm8k-train

Inside a debate the judge only sees the rounds it is asked about, so judging stored rounds measures the same
detector without running the debates again: a round pair costs one judge call (~1,100 prompt tokens) instead of a
whole debate, and none under an answer-naming prompt (verify, verify-cot) when the plurality did not change. The request is the one `InterventionProtocol` sends (`judge_messages`, same sampling and seed
derivation), so a prompt chosen here behaves the same in `mad+judge+...` runs. Compare prompts on training-split
debates (the corpus) and confirm the chosen one once on test-split traces.

`--traces` takes eval.run trace files (`OUT/traces/<benchmark>/<method>.jsonl`) or corpus directories
(`results/corpus-*`), comma-separated. Every verdict is appended to `OUT/verdicts.jsonl` as soon as its batch
returns; a rerun judges only the missing pairs. `OUT/judge.md` and `judge.csv` give TP/FP/TN/FN, precision,
recall, specificity and accuracy with 95 % Clopper-Pearson intervals, per prompt. Drift is rare (12 of 240
corpus pairs), so `--drifted-only` judges just the FOCUS-drift pairs among the first `--n` to measure recall
without judging every pair; the report then marks precision and accuracy as of an enriched sample.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scipy.stats import binomtest

from dear import metrics, tasks
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.debate.cli_args import OMIT, REQUIRED, add_backend_args, add_output_args
from dear.debate.interventions import (
    JUDGE_PROMPTS,
    SKIPPED_REASON,
    InterventionConfig,
    focus_drift,
    intervention_request,
    judge_messages,
    judge_verdict,
    needs_judge_call,
    round_outcome,
)
from dear.debate.trace import AgentTurn, DebateTrace, read_jsonl
from dear.llm.base import Backend, ChatRequest
from dear.llm.registry import is_synthetic
from dear.tasks.types import Question

log = logging.getLogger(__name__)
PROG = "python -m eval.judge_offline"
VERDICTS_FILE = "verdicts.jsonl"


@dataclass(frozen=True)
class RoundPair:
    """One judged unit: round `round - 1` and round `round` of a stored debate."""

    source: str  # the trace file or corpus it came from
    trace: DebateTrace
    round: int

    @property
    def key(self) -> str:
        return f"{self.source}|{self.trace.debate_id}|{self.round}"

    @property
    def prev(self) -> list[AgentTurn]:
        return self.trace.rounds[self.round - 1]

    @property
    def cur(self) -> list[AgentTurn]:
        return self.trace.rounds[self.round]

    def focus_drift(self) -> bool:
        return focus_drift(round_outcome(self.prev), round_outcome(self.cur))


IN_ORDER = "in order"
DRIFT_ONLY = "FOCUS drift only"


@dataclass(frozen=True)
class StoredVerdict:
    """One line of verdicts.jsonl."""

    key: str
    prompt: str
    question_id: str
    round: int
    drifted: bool
    malformed: bool
    focus_drift: bool
    reason: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    selected: str = IN_ORDER  # how the pair was chosen: IN_ORDER or DRIFT_ONLY (--drifted-only)
    skipped: bool = False  # no call: the prompt's verdict could not be "drift" (needs_judge_call)


# ---------------------------------------------------------------- inputs
def load_traces(source: str) -> list[DebateTrace]:
    """The finished debates of an eval.run trace file (last write per question wins, as in eval.run) or a corpus."""
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"--traces {source}: no such file or directory")
    if path.is_dir() or path.name.endswith(".jsonl.gz"):
        from dear.debate.corpus_file import iter_traces, read_corpus

        traces = list(iter_traces(read_corpus(path)))
    else:
        traces = list({t.question_id: t for t in read_jsonl(path)}.values())
    return [t for t in traces if not t.failed]


def round_pairs(source: str, traces: Sequence[DebateTrace]) -> Iterator[RoundPair]:
    """Every exchange round whose agents all answered, with the round before it."""
    for t in traces:
        for r in range(1, len(t.rounds)):
            if all(turn.error is None for turn in t.rounds[r - 1] + t.rounds[r]):
                yield RoundPair(source, t, r)


def question_index(task: str) -> dict[str, Question]:
    """Every question of a task, all splits, by id (traces keep the text but not a choice question's options)."""
    spec = tasks.get_task(task)
    out: dict[str, Question] = {}
    for split in spec.splits:
        out.update({q.id: q for q in tasks.load(task, split=split)})
    return out


def read_verdicts(path: Path) -> list[StoredVerdict]:
    if not path.exists():
        return []
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(StoredVerdict(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}:{i}: not a verdict line ({e})") from None
    return out


# ---------------------------------------------------------------- judging
def judge_pairs(backend: Backend, pairs: Sequence[RoundPair], questions: dict[str, dict[str, Question]],
                config: InterventionConfig, seed: int, out: Path, batch: int = 9,
                selected: str = IN_ORDER) -> list[StoredVerdict]:
    """Judge `pairs` in batches of `batch` requests, appending each batch's verdicts to `out` as it returns.
    Pairs the prompt needs no call for (`needs_judge_call`) are recorded at once as skipped."""
    prompt = config.judge_prompt
    needs_call = [needs_judge_call(prompt, p.prev, p.cur) for p in pairs]
    skipped = [p for p, call in zip(pairs, needs_call) if not call]
    rows = [StoredVerdict(key=p.key, prompt=prompt, question_id=p.trace.question_id, round=p.round, drifted=False,
                          malformed=False, focus_drift=p.focus_drift(), reason=SKIPPED_REASON, text="",
                          prompt_tokens=0, completion_tokens=0, selected=selected, skipped=True) for p in skipped]
    _append(out, rows)
    done = list(rows)
    called = [p for p, call in zip(pairs, needs_call) if call]
    for start in range(0, len(called), batch):
        chunk = called[start:start + batch]
        asked = [questions[p.trace.task][p.trace.question_id] for p in chunk]
        reqs = [_request(p, q, config, seed) for p, q in zip(chunk, asked)]
        comps = backend.generate(reqs)
        if len(comps) != len(reqs):
            raise RuntimeError(f"backend returned {len(comps)} completions for {len(reqs)} requests")
        rows = []
        for p, q, c in zip(chunk, asked, comps):
            v = judge_verdict(prompt, c.text, q, p.prev, p.cur) if c.error is None else None
            rows.append(StoredVerdict(
                key=p.key, prompt=prompt, question_id=p.trace.question_id, round=p.round,
                drifted=bool(v and v.drifted), malformed=v is None or v.malformed, focus_drift=p.focus_drift(),
                reason=v.reason if v else "", text=c.text or "", prompt_tokens=c.prompt_tokens,
                completion_tokens=c.completion_tokens, error=c.error, selected=selected))
        _append(out, rows)
        done += rows
        log.info("judged %d / %d round pairs (%d more need no call)", start + len(chunk), len(called), len(skipped))
    return done


def _append(path: Path, rows: Sequence[StoredVerdict]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(asdict(r), ensure_ascii=False) + "\n" for r in rows)


def _request(pair: RoundPair, question: Question, config: InterventionConfig, seed: int) -> ChatRequest:
    """The request InterventionProtocol sends for this round pair inside a debate."""
    msgs = judge_messages(question, pair.prev, pair.cur, config.solution_chars, config.judge_prompt)
    return intervention_request("judge", msgs, seed, pair.trace, pair.round, None, config.judge_temperature,
                                config.judge_tokens)


# ---------------------------------------------------------------- report
def _interval(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return math.nan, math.nan
    ci = binomtest(k, n).proportion_ci(0.95, method="exact")
    return ci.low, ci.high


def score(verdicts: Sequence[StoredVerdict]) -> dict[str, Any]:
    """Confusion counts against FOCUS and each rate with its 95 % Clopper-Pearson interval."""
    det = metrics.detection([v.drifted for v in verdicts], [v.focus_drift for v in verdicts])
    row: dict[str, Any] = {"pairs": det.n, "tp": det.tp, "fp": det.fp, "tn": det.tn, "fn": det.fn,
                           "calls": sum(not v.skipped for v in verdicts),
                           "malformed": sum(v.malformed for v in verdicts),
                           "flagged_pct": 100 * (det.tp + det.fp) / max(1, det.n)}
    for name, k, n in (("precision", det.tp, det.tp + det.fp), ("recall", det.tp, det.tp + det.fn),
                       ("specificity", det.tn, det.tn + det.fp), ("accuracy", det.tp + det.tn, det.n)):
        low, high = _interval(k, n)
        row.update({name: k / n if n else math.nan, f"{name}_low": low, f"{name}_high": high})
    row["tokens_per_pair"] = sum(v.prompt_tokens + v.completion_tokens for v in verdicts) / max(1, len(verdicts))
    return row


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def write_report(out: Path, verdicts: Sequence[StoredVerdict], command: str, synthetic: bool) -> list[dict]:
    rows = []
    for prompt in sorted({v.prompt for v in verdicts}):
        mine = [v for v in verdicts if v.prompt == prompt]
        rows.append({"prompt": prompt, **score(mine), "enriched": any(v.selected == DRIFT_ONLY for v in mine)})
    title = "# DRIFTJudge on stored debates" + (" (SYNTHETIC: sim backend)" if synthetic else "")
    lines = [title, "", f"Command: `{command}`", "",
             "| prompt | round pairs | judge calls | flagged | TP/FP/TN/FN | precision [95% CI] | recall [95% CI] | "
             "specificity [95% CI] | accuracy [95% CI] | malformed | tokens/pair |", "|" + "---|" * 11]
    for r in rows:
        cells = [f"{_pct(r[k])} [{_pct(r[f'{k}_low'])}, {_pct(r[f'{k}_high'])}]"
                 + (" (enriched)" if r["enriched"] and k in ("precision", "accuracy") else "")
                 for k in ("precision", "recall", "specificity", "accuracy")]
        lines.append(" | ".join([f"| {r['prompt'] + (' (synthetic)' if synthetic else '')}", str(r["pairs"]),
                                 str(r["calls"]), f"{r['flagged_pct']:.1f}%", f"{r['tp']}/{r['fp']}/{r['tn']}/{r['fn']}", *cells,
                                 str(r["malformed"]), f"{r['tokens_per_pair']:,.0f}"]) + " |")
    lines += ["", "Labels: FOCUS < 0 between the two rounds (the group plurality score fell; dear/metrics.py). "
              "Malformed verdicts count as 'no drift'. Intervals: exact binomial (scipy). Tokens/pair averages over "
              "all judged pairs; an answer-naming prompt (verify) needs no call where the plurality did not change "
              "(no drift under any answer), so it has fewer calls than pairs."]
    if any(r["enriched"] for r in rows):
        lines += ["", "(enriched): the judged pairs include pairs chosen because FOCUS labels them drift "
                  "(`--drifted-only`), so drift is over-represented: recall and specificity are per class and "
                  "unaffected; precision and accuracy are of the judged pairs, not of debates."]
    (out / "judge.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with (out / "judge.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["prompt"])
        w.writeheader()
        w.writerows(rows)
    return rows


# ---------------------------------------------------------------- command line
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", required=True, help="comma-separated eval.run trace files or corpus directories")
    add_backend_args(p, llm_note="the judge's (the debaters' model by default)", max_tokens=OMIT)
    p.add_argument("--prompt", default=InterventionConfig.judge_prompt, choices=sorted(JUDGE_PROMPTS),
                   help="the judge's instruction (default: the in-debate judge's, %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the eval.run seed the judge's request seeds derive from")
    p.add_argument("--n", type=int, default=0, help="judge at most this many round pairs (0 = all), in input order")
    p.add_argument("--drifted-only", action="store_true",
                   help="judge only pairs FOCUS labels drift (of the first --n): measures recall cheaply")
    p.add_argument("--batch", type=int, default=9, help="requests per backend call (and per verdicts.jsonl flush)")
    add_output_args(p, out_help="results directory (verdicts.jsonl, judge.md, judge.csv)", out=REQUIRED,
                    report_only="rebuild judge.md / judge.csv from verdicts.jsonl")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None, backend: Backend | None = None) -> list[dict]:
    a = parse_args(argv)
    if a.n < 0 or a.batch < 1:
        raise ValueError(f"--n must be >= 0 and --batch >= 1, got --n {a.n} --batch {a.batch}")
    config = InterventionConfig(judge=True, judge_prompt=a.prompt)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    verdicts_path = out / VERDICTS_FILE
    synthetic = is_synthetic(a.llm)
    if not a.report_only:
        sources = [s.strip() for s in a.traces.split(",") if s.strip()]
        pairs = [p for s in sources for p in round_pairs(str(Path(s)), load_traces(s))]
        pairs = pairs[:a.n] if a.n else pairs
        if a.drifted_only:
            pairs = [p for p in pairs if p.focus_drift()]
        judged = {v.key for v in read_verdicts(verdicts_path) if v.prompt == a.prompt}
        todo = [p for p in pairs if p.key not in judged]
        print(f"{len(pairs)} round pairs, {len(pairs) - len(todo)} already judged with prompt {a.prompt!r}, "
              f"{len(todo)} to judge")
        if todo:
            questions = {task: question_index(task) for task in {p.trace.task for p in todo}}
            own = backend is None
            if own:
                from dear.llm.registry import make_backend

                opts = {k: v for k, v in (("n_parallel", a.parallel), ("n_ctx", a.n_ctx)) if v}
                backend = make_backend(a.llm, **opts)
            synthetic = synthetic or backend.synthetic
            try:
                judge_pairs(backend, todo, questions, config, a.seed, verdicts_path, a.batch,
                            DRIFT_ONLY if a.drifted_only else IN_ORDER)
            finally:
                if own:
                    backend.close()
    rows = write_report(out, read_verdicts(verdicts_path), command_line(PROG, argv),
                        synthetic)
    print((out / "judge.md").read_text(encoding="utf-8"))
    return rows


if __name__ == "__main__":
    run_cli(main, PROG)
