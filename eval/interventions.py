"""Evaluation methods with the seed papers' interventions, and their report (cost, judge quality, moderator).

Method names are `<base>+<intervention>...`: the base is a debate or DEAR method of `eval.methods` (`mad`,
`dear`, `dear-no-selection`, ...), the interventions are

    judge                DRIFTJudge after every exchange round (detection only)
    judge+policy         + DRIFTPolicy advice in the next round's prompts
    judge+regenerate     + a flagged round redone once at a non-zero temperature
    moderator            moderator (accept / ignore / demote) with the agenda state machine
    moderator-noagenda   the moderator alone

e.g. `mad+judge+policy`, `mad+judge+regenerate`, `mad+moderator`, `dear+judge+policy`.

    python -m eval.interventions report --out results/eval-gsm8k-n30-s0 --benchmark gsm8k \\
        --methods mad,mad+judge+policy,mad+judge+regenerate,mad+moderator

reads the traces an `eval.run` results directory holds and writes `interventions.md` / `interventions.csv`:
accuracy, debater and extra tokens, drift and recovery (FOCUS), the judge's confusion counts against the FOCUS
labels, the moderator's rejection rate and the rounds per agenda stage.

    python -m eval.interventions prime-cache --cache OUT/cache.sqlite --traces OLD/traces/gsm8k/mad.jsonl

stores the answers of earlier traces in a response cache, so a new results directory reuses them (round 0 and
every MAD / DEAR round an intervention leaves unchanged) instead of generating them again.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dear import metrics
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.debate.interventions import (
    focus_drift,
    judged_pairs,
    summarize_interventions,
)
from dear.debate.trace import DebateTrace, read_jsonl
from dear.llm import cache
from dear.llm.base import ChatMessage, ChatRequest, Completion
from dear.llm.registry import is_synthetic
from eval.methods import (  # noqa: F401  (the spec functions live in eval.methods; this module reports)
    EXAMPLES,
    INTERVENTIONS,
    base_method,
    build_intervention_method,
    intervention_spec,
    is_intervention_method,
    parse_intervention_method,
    run_method,
)
from eval.report import moved_note, read_regrade_record, trace_to_record

# ---------------------------------------------------------------- reusing stored traces
def prime_cache(cache_path: str | Path, traces: Sequence[DebateTrace]) -> int:
    """Store every successful debater turn of `traces` in the response cache at `cache_path`, under the key the
    engine's request for that turn has (model id, messages, sampling, seed). A later eval.run with the same
    settings then reuses those answers: round 0 for every method, and the rounds of MAD / DEAR that an
    intervention leaves unchanged. Regenerated (discarded) rounds are not stored: they answered no request that
    a kept round did. Existing entries are kept. Returns the number of turns stored."""
    entries = []
    for t in traces:
        for turns in t.rounds:
            for turn in turns:
                if turn.error is not None or not turn.model_id:
                    continue
                req = ChatRequest(messages=tuple(ChatMessage(m["role"], m["content"]) for m in turn.messages),
                                  temperature=turn.temperature, top_p=turn.top_p, max_tokens=turn.max_tokens,
                                  seed=turn.seed)
                comp = Completion(turn.text, turn.prompt_tokens, turn.completion_tokens, turn.finish_reason,
                                  turn.latency_s, reused_prompt_tokens=turn.reused_prompt_tokens)
                entries.append((turn.model_id, req, comp))
    return cache.prime(cache_path, entries)


# ---------------------------------------------------------------- report
def judge_confusion(traces: Sequence[DebateTrace]) -> metrics.Detection:
    """DRIFTJudge's verdicts against the FOCUS labels (drift = the judged round's group score fell below the
    previous round's), over every judged round including rounds later regenerated."""
    pairs = judged_pairs(traces)
    predicted = [p for p, _, _ in pairs]
    actual = [focus_drift(prev, cur) for _, prev, cur in pairs]
    return metrics.detection(predicted, actual)


def method_row(benchmark: str, method: str, traces: Sequence[DebateTrace], seed: int = 0) -> dict[str, Any]:
    """One table row: accuracy, tokens (debaters vs extra), drift/recovery, judge and moderator numbers."""

    summary = metrics.summarize([trace_to_record(t) for t in traces], seed=seed)
    iv = summarize_interventions(traces)
    det = judge_confusion(traces)
    row: dict[str, Any] = {
        "benchmark": benchmark, "method": method, "n": summary.n,
        "accuracy": summary.accuracy.mean, "acc_ci_low": summary.accuracy.low, "acc_ci_high": summary.accuracy.high,
        "debater_tokens_per_q": iv.debater_tokens / max(1, len(traces)),
        "extra_tokens_per_q": iv.extra_tokens / max(1, len(traces)),
        "extra_overhead": iv.overhead,
        "drifted_pct": 100 * summary.drifted.rate, "drifted_num": summary.drifted.num,
        "drifted_den": summary.drifted.den, "recovered_pct": 100 * summary.recovered.rate,
        "recovered_num": summary.recovered.num,
    }
    row.update({f"judge_{k}": v for k, v in det.to_row().items()} if det.n else {})
    row.update(iv.to_row())
    return row


def paired_to_base(rows: list[dict[str, Any]], loaded: dict[str, list[DebateTrace]], seed: int = 0,
                   n_boot: int = 2000) -> None:
    """Add each intervention method's accuracy difference to its base method (paired bootstrap over the common
    questions, 95 % CI) as `diff_to_base*` keys, when the base method is in the report."""
    correct = {m: {t.question_id: t.final_expected for t in ts} for m, ts in loaded.items()}  # ties: expected
    for row in rows:
        base = base_method(row["method"])
        if base == row["method"] or base not in correct:
            continue
        common = sorted(set(correct[row["method"]]) & set(correct[base]))
        d = metrics.paired_bootstrap_diff([correct[row["method"]][q] for q in common],
                                          [correct[base][q] for q in common], seed=seed, n_boot=n_boot)
        row.update(diff_to_base=d.mean, diff_to_base_low=d.low, diff_to_base_high=d.high, base_method=base)


def _fmt(x: Any, pct: bool = False) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{100 * x:.1f}%" if pct else f"{x:,.2f}"
    return str(x)


def markdown(rows: Sequence[dict[str, Any]], command: str, synthetic: bool) -> str:
    title = "# Interventions" + (" (SYNTHETIC: sim backend)" if synthetic else "")
    lines = [title, "", f"Command: `{command}`", "",
             "| benchmark | method | n | accuracy [95% CI] | − base, paired [95% CI] | debater tok/q | "
             "extra tok/q (overhead) | drifted | recovered | judge calls / rounds judged | judge TP/FP/TN/FN | "
             "precision | recall | specificity | judge acc | malformed verdicts | moderator rejection | "
             "rounds per stage |",
             "|" + "---|" * 18]
    for r in rows:
        judge = (f"{r['judge_tp']}/{r['judge_fp']}/{r['judge_tn']}/{r['judge_fn']}" if "judge_tp" in r else "-")
        stages = ", ".join(f"{k[len('rounds_'):]}={v}" for k, v in r.items() if k.startswith("rounds_") and v)
        rej = (f"{_fmt(r['rejection_rate'], True)} ({r['moderator_ignore']} ignored, {r['moderator_demote']} "
               f"demoted of {r['moderator_rated']}; {r['moderator_malformed']} malformed)"
               if r["moderator_rated"] else "-")
        diff = (f"{100 * r['diff_to_base']:+.1f} [{100 * r['diff_to_base_low']:+.1f}, "
                f"{100 * r['diff_to_base_high']:+.1f}] (vs {r['base_method']})" if "diff_to_base" in r else "-")
        calls = (f"{r['judge_verdicts'] - r['judge_skipped']} / {r['judge_verdicts']}" if r["judge_verdicts"]
                 else "-")
        lines.append(" | ".join([
            f"| {r['benchmark']}", r["method"], str(r["n"]),
            f"{_fmt(r['accuracy'], True)} [{_fmt(r['acc_ci_low'], True)}, {_fmt(r['acc_ci_high'], True)}]", diff,
            f"{r['debater_tokens_per_q']:,.0f}", f"{r['extra_tokens_per_q']:,.0f} ({_fmt(r['extra_overhead'], True)})",
            f"{_fmt(r['drifted_pct'] / 100, True)} ({r['drifted_num']}/{r['drifted_den']})",
            f"{_fmt(r['recovered_pct'] / 100, True)} ({r['recovered_num']})", calls, judge,
            _fmt(r.get("judge_precision", math.nan)), _fmt(r.get("judge_recall", math.nan)),
            _fmt(r.get("judge_specificity", math.nan)), _fmt(r.get("judge_accuracy", math.nan)),
            f"{r['judge_malformed']}/{r['judge_verdicts']}" if r["judge_verdicts"] else "-", rej, stages or "-",
        ]) + " |")
    lines += ["", "Debater tokens = the kept debater turns; extra tokens = judge, feedback and moderator calls plus "
              "regenerated (discarded) debater rounds. Judge labels: FOCUS < 0 between the two judged rounds "
              "(group plurality score, dear/metrics.py). Malformed verdicts count as 'no drift'. An answer-naming "
              "judge prompt (the default, verify-cot) makes no call on a round whose plurality held (no drift under "
              "any answer), hence fewer judge calls than rounds judged. − base: accuracy minus the wrapped method's "
              "(MAD or DEAR) on the same questions, paired bootstrap (2,000 resamples, seed 0)."]
    return "\n".join(lines) + "\n"


def report(out: str | Path, benchmark: str, methods: Sequence[str], command: str = "") -> list[dict[str, Any]]:
    """Rows for `methods` from an eval.run results directory (on the questions every method finished)."""
    out = Path(out)
    loaded: dict[str, list[DebateTrace]] = {}
    for m in methods:
        path = out / "traces" / benchmark / f"{m}.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no traces of method {m!r} (run `python -m eval.run` first)")
        latest = {t.question_id: t for t in read_jsonl(path)}  # last write wins, as in eval.run
        loaded[m] = list(latest.values())
    common = set.intersection(*({t.question_id for t in ts} for ts in loaded.values()))
    if not common:
        raise ValueError(f"{out}: the methods {list(methods)} share no finished question")
    loaded = {m: sorted((t for t in ts if t.question_id in common), key=lambda t: t.question_id)
              for m, ts in loaded.items()}
    rows = [method_row(benchmark, m, ts) for m, ts in loaded.items()]
    paired_to_base(rows, loaded)
    synthetic = any(is_synthetic(mid) for ts in loaded.values() for t in ts for mid in t.model_ids)
    text = markdown(rows, command, synthetic)
    record = read_regrade_record(out)
    if record is not None and record.get("before_interventions"):  # eval.regrade re-graded these traces
        seeded = {m: sum(t.final_correct for t in ts) / len(ts) for m, ts in loaded.items()}
        text += "\n" + "\n".join(moved_note(record, {f"{benchmark}/{r['method']}": (r["accuracy"], seeded[r["method"]])
                                                      for r in rows}, before="before_interventions"))
    (out / "interventions.md").write_text(text, encoding="utf-8")
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with (out / "interventions.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.interventions", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="tables from an eval.run results directory")
    r.add_argument("--out", required=True, help="an eval.run results directory")
    r.add_argument("--benchmark", required=True)
    r.add_argument("--methods", required=True, help="comma-separated method names with traces in --out")
    c = sub.add_parser("prime-cache", help="store the answers of finished traces in a response cache")
    c.add_argument("--cache", required=True, help="response cache file (eval.run's OUT/cache.sqlite)")
    c.add_argument("--traces", required=True, help="comma-separated trace files (*.jsonl) to take answers from")
    a = p.parse_args(argv)
    if a.cmd == "prime-cache":
        total = 0
        for path in [x.strip() for x in a.traces.split(",") if x.strip()]:
            if not Path(path).exists():
                raise FileNotFoundError(f"--traces {path}: no such file")
            n = prime_cache(a.cache, read_jsonl(path))
            print(f"{path}: {n} answers stored in {a.cache}")
            total += n
        return 0
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    for m in methods:
        if is_intervention_method(m):
            parse_intervention_method(m)
    report(a.out, a.benchmark, methods, command_line("python -m eval.interventions", argv))
    print((Path(a.out) / "interventions.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    run_cli(main, "python -m eval.interventions")
