"""Traces -> metrics -> summary.csv and summary.md (a table a paper would print, plus the detail tables)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dear.debate.trace import DebateTrace
from dear.metrics import TRANSITIONS, ScoredDebate, MethodSummary, Ratio, paired_bootstrap_diff, summarize
from dear.debate.methods import BASELINES, METHODS
from eval.profile_transitions import NOBODY, ProfileStep, profile_steps

REGRADE_RECORD = "regrade.json"  # written by eval.regrade beside the traces it re-graded
TIE_RULE = ("Ties count as expected values: a k-way tie whose leaders include the correct answer scores 1/k, so "
            "per-question scores are fractional where tied.")


def trace_to_record(trace: DebateTrace) -> ScoredDebate:
    """Plain arrays of one debate for dear.metrics."""
    grader = "none"
    if trace.final_answer is not None and trace.rounds:  # the last round first: an all-answers vote may pick earlier
        turns = [t for turns in reversed(trace.rounds) for t in turns]
        grader = next((t.grader for t in turns if t.answer_key == trace.final_answer), "none")
    return ScoredDebate(
        answers=trace.answer_keys(),
        correct=trace.correctness().tolist(),
        final_correct=bool(trace.final_correct),
        final_score=trace.final_expected,
        prompt_tokens=int(trace.prompt_tokens + trace.extra_prompt_tokens),  # interventions' calls included
        completion_tokens=int(trace.completion_tokens + trace.extra_completion_tokens),
        tie=bool(trace.tie),
        failed=bool(trace.failed),
        final_grader=grader,
        question_id=trace.question_id,
        peers_read=[[len(t.peers) for t in turns] for turns in trace.rounds],
        truncated=[[t.finish_reason == "length" for t in turns] for turns in trace.rounds],
    )


@dataclass(frozen=True)
class AgentRow:
    """One agent of a method's debates: what it cost and how often it was right (the per-agent report of a mixed
    pool, `--agent-profiles`)."""

    agent: int
    profile: str  # its profile's compact name, else its model id
    n: int  # debates with this agent
    tokens: float  # mean prompt + completion tokens of its calls per debate (kept turns cost 0)
    round0_accuracy: float  # share of its round-0 answers that are correct
    final_accuracy: float  # share of its answers in the last round its debate ran that are correct


def agent_rows(traces: Sequence[DebateTrace]) -> list[AgentRow]:
    """Per-agent tokens and round-0 / last-round accuracy over finished traces (agents beyond a trace's width, as
    in adaptive self-consistency, count where they answered)."""
    width = max((len(t.rounds[0]) for t in traces if t.rounds), default=0)
    rows = []
    for agent in range(width):
        have = [t for t in traces if t.rounds and agent < len(t.rounds[0])]
        first = [t.rounds[0][agent] for t in have]
        profile = next((turn.profile for turn in first if turn.profile), None) or have[0].model_ids[agent]
        tokens = [sum(x.prompt_tokens + x.completion_tokens for turns in t.rounds for x in turns if x.agent == agent)
                  for t in have]
        rows.append(AgentRow(agent, profile, len(have), sum(tokens) / len(have),
                             sum(x.correct for x in first) / len(have),
                             sum(t.rounds[-1][agent].correct for t in have) / len(have)))
    return rows


@dataclass
class MethodResult:
    benchmark: str
    method: str
    label: str
    summary: MethodSummary
    # Per-question final score, ties as expected values (fractional where tied): for paired comparisons.
    correct_by_question: dict[str, float] = field(default_factory=dict)
    agents: list[AgentRow] = field(default_factory=list)  # per agent (reported for mixed pools)
    steps: list[ProfileStep] = field(default_factory=list)  # steps by profile and profiles read (mixed pools)


def evaluate(benchmark: str, method: str, label: str, traces: Sequence[DebateTrace], seed: int = 0,
             n_boot: int = 2000) -> MethodResult:
    records = [trace_to_record(t) for t in traces]
    return MethodResult(
        benchmark=benchmark, method=method, label=label, summary=summarize(records, seed=seed, n_boot=n_boot),
        correct_by_question={r.question_id: r.score for r in records}, agents=agent_rows(traces),
        steps=profile_steps(traces),
    )


# ---------------------------------------------------------------- the accuracy-cost frontier
FRONTIER_RULE = ("Dominated by: the methods with accuracy ≥ and tokens per question ≤ this method's on the same "
                 "benchmark, strictly better in at least one (point estimates: accuracy with ties as expected values, "
                 "mean tokens; the intervals are not tested); — = on the accuracy–cost frontier.")


def _ablated_method(method: str) -> str | None:
    """The full method an ablation or control belongs to ("dear-random-mask" -> "dear"); a combined report's
    "<key>@<policy>" keeps its policy ("dear-random-mask@P" -> "dear@P")."""
    key, at, policy = method.partition("@")
    spec = METHODS.get(key)
    return None if spec is None or not spec.ablates else spec.ablates + at + policy


def dominated_by(results: Sequence[MethodResult]) -> dict[tuple[str, str], list[str]]:
    """(benchmark, method) -> the methods of the same benchmark that dominate it (FRONTIER_RULE), in result order;
    an empty list puts it on the frontier."""
    def point(r: MethodResult) -> tuple[float, float]:
        return r.summary.accuracy.mean, r.summary.total_tokens.mean

    out = {}
    for r in results:
        acc, tok = point(r)
        out[(r.benchmark, r.method)] = [
            o.method for o in results if o.benchmark == r.benchmark and o.method != r.method
            and point(o)[0] >= acc and point(o)[1] <= tok and point(o) != (acc, tok)]
    return out


# ---------------------------------------------------------------- CSV
def write_csv(results: Sequence[MethodResult], path: Path,
              failures: dict[tuple[str, str], list[tuple[str, str]]] | None = None) -> None:
    """One row per (benchmark, method); ``failed_pending`` = failed debates a rerun will retry (not in n)."""
    rows: list[dict[str, Any]] = []
    columns: dict[str, None] = {"benchmark": None, "method": None, "label": None}
    for res in results:
        row = {"benchmark": res.benchmark, "method": res.method, "label": res.label, **res.summary.to_row(),
               "failed_pending": len((failures or {}).get((res.benchmark, res.method), []))}
        rows.append(row)
        columns.update(dict.fromkeys(row))
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), restval="")
        w.writeheader()
        for row in rows:
            w.writerow({k: _csv_value(v) for k, v in row.items()})


def _csv_value(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else round(v, 6)
    return v


# ---------------------------------------------------------------- Markdown
def _pct(x: float, digits: int = 1) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.{digits}f}"


def _ratio(r: Ratio) -> str:
    return "–" if r.den == 0 else f"{100 * r.rate:.1f} ({r.num}/{r.den})"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def markdown(results: Sequence[MethodResult], meta: dict[str, Any], baselines: Sequence[str] = BASELINES,
             seed: int = 0, n_boot: int = 2000) -> str:
    """The full summary.md text. `meta` carries the command, model, seeds and labels for the header, and
    optionally `failures` {(benchmark, method): [(question_id, error)]} (failed debates that remain, left out
    of the accuracy) and `generation_s` {benchmark: seconds}. `baselines`: the methods every other is paired
    with (default: the catalog's, `dear.debate.methods.BASELINES`)."""
    benchmarks = list(dict.fromkeys(r.benchmark for r in results))
    methods = list(dict.fromkeys(r.method for r in results))
    by = {(r.benchmark, r.method): r for r in results}
    if "n" not in meta:
        meta = {**meta, "n": ", ".join(f"{b}: {max(r.summary.n for r in results if r.benchmark == b)}"
                                       for b in benchmarks)}
    failures: dict[tuple[str, str], list[tuple[str, str]]] = meta.get("failures", {})
    lines = _header(meta)
    lines += _accuracy_table(results, benchmarks, methods, by)
    lines += _paired_tables(results, benchmarks, methods, by, baselines, seed, n_boot)
    lines += _generation_table(meta.get("generation_s") or {}, benchmarks)
    for b in benchmarks:
        lines += _benchmark_section(b, [by[(b, m)] for m in methods if (b, m) in by], failures)
    if meta.get("agent_profiles"):
        lines += _agent_section(results)
    lines += _failures_section(results, meta, failures)
    return "\n".join(lines + DEFINITIONS)


def _header(meta: dict[str, Any]) -> list[str]:
    """Title, the synthetic warning, the run's settings and the notes."""
    lines = [f"# {meta.get('title', 'DEAR evaluation')}", ""]
    if meta.get("synthetic"):
        lines += [("> **SYNTHETIC** — produced with the `sim` backend (synthetic debaters, no language model). "
                  "These numbers test the pipeline; they are not LLM results."), ""]
    for key, name in (("command", "Command"), ("model", "Model"), ("checkpoint", "Checkpoint"),
                      ("policy_sampling", "Policy actions"), ("seed", "Seed"), ("n", "Questions reported"),
                      ("debate", "Debate"), ("date", "Date"), ("wall_time", "Wall time")):
        if meta.get(key) not in (None, ""):
            value = f"`{meta[key]}`" if key == "command" else str(meta[key])
            lines.append(f"- **{name}:** {value}")
    for note in meta.get("notes", []):
        lines.append(f"- {note}")
    return lines + [""]


def _accuracy_table(results: Sequence[MethodResult], benchmarks: list[str], methods: list[str],
                    by: dict[tuple[str, str], MethodResult]) -> list[str]:
    """The paper table: accuracy [CI] and tokens per benchmark, and who dominates each method."""
    lines = ["## Accuracy and cost", "",
             (f"{TIE_RULE} Accuracy in % with a 95 % percentile-bootstrap CI over questions (seeded); tokens = "
              "mean prompt + completion tokens of all calls per question."), ""]
    header = ["Method"]
    for b in benchmarks:
        header += [f"{b} acc % [95 % CI]", f"{b} tokens/q"]
    header += [f"{b} dominated by" for b in benchmarks]
    dominated = dominated_by(results)
    rows = []
    for m in methods:
        row = [next(r.label for r in results if r.method == m)]
        for b in benchmarks:
            r = by.get((b, m))
            if r is None:
                row += ["–", "–"]
                continue
            a = r.summary.accuracy
            row += [f"{_pct(a.mean)} [{_pct(a.low)}, {_pct(a.high)}]", f"{r.summary.total_tokens.mean:,.0f}"]
        row += [(", ".join(by_label(results, d) for d in dominated[(b, m)]) or "—") if (b, m) in by else "–"
                for b in benchmarks]
        rows.append(row)
    return lines + _table(header, rows) + ["", FRONTIER_RULE, ""]


def _paired_tables(results: Sequence[MethodResult], benchmarks: list[str], methods: list[str],
                   by: dict[tuple[str, str], MethodResult], baselines: Sequence[str], seed: int,
                   n_boot: int) -> list[str]:
    """Every method minus each baseline present, then each full method minus its ablations and controls."""
    lines: list[str] = []
    for baseline in baselines:
        if baseline not in methods:
            continue
        lines += [f"### Paired difference to {by_label(results, baseline)} (same questions)", "",
                  ("Accuracy difference in percentage points (ties as expected values) with a paired bootstrap "
                   "95 % CI."), ""]
        rows = [[by_label(results, m)] + _paired_diffs(by, benchmarks, m, baseline, seed, n_boot)
                for m in methods if m != baseline]
        lines += _table(["Method"] + benchmarks, rows) + [""]

    ablations = [(m, full) for m in methods if (full := _ablated_method(m)) in methods]
    if ablations:
        lines += ["### Paired difference of each method to its ablations and controls (same questions)", "",
                  ("Accuracy of the full method minus its ablation, in percentage points, with a paired bootstrap "
                   "95 % CI: what the ablated part adds."), ""]
        rows = [[f"{by_label(results, full)} − {by_label(results, m)}"]
                + _paired_diffs(by, benchmarks, full, m, seed, n_boot) for m, full in ablations]
        lines += _table(["Comparison"] + benchmarks, rows) + [""]
    return lines


def _generation_table(generation: dict[str, float], benchmarks: list[str]) -> list[str]:
    if not generation:
        return []
    lines = ["### Generation time per benchmark", "",
             "Wall time of all generation in this directory (all runs of the command, all methods).", ""]
    return lines + _table(["Benchmark", "minutes"], [[b, f"{generation[b] / 60:.1f}"] for b in benchmarks
                                                     if b in generation]) + [""]


def _benchmark_section(b: str, res: list[MethodResult], failures: dict[tuple[str, str], list[tuple[str, str]]]
                       ) -> list[str]:
    """One benchmark's detail table, and the per-round tables of its methods that debate."""
    lines = [f"## {b}", ""]
    lines += [("n = finished debates (accuracy is over these); failed = debates of this method whose backend "
               "failed and that a rerun of the command retries (not in the accuracy), plus any legacy failed "
               "traces counted as wrong. Truncated = agent answers cut at the token limit; without a marked "
               "answer they count as no answer."), ""]
    lines += _table(
        ["Method", "n", "acc %", "95 % CI", "acc %, seeded tie pick", "prompt tok/q", "completion tok/q",
         "total tok/q", "failed", "final ties", "no-answer %", "truncated % (no answer)",
         "graders (final answer)"],
        [[r.label, str(r.summary.n), _pct(r.summary.accuracy.mean),
          f"[{_pct(r.summary.accuracy.low)}, {_pct(r.summary.accuracy.high)}]",
          _pct(r.summary.accuracy_seeded.mean),
          f"{r.summary.prompt_tokens:,.0f}", f"{r.summary.completion_tokens:,.0f}",
          f"{r.summary.total_tokens.mean:,.0f}",
          str(r.summary.failed + len(failures.get((b, r.method), []))), str(r.summary.final_ties),
          _pct(r.summary.no_answer.rate),
          f"{_ratio(r.summary.truncated)}; {_ratio(r.summary.truncated_no_answer)}",
          ", ".join(f"{g}: {c}" for g, c in sorted(r.summary.graders.items()))]
         for r in res],
    ) + [""]
    debates = [r for r in res if r.summary.n_rounds > 1]
    return lines + (_round_tables(debates) if debates else [])


def _round_tables(debates: list[MethodResult]) -> list[str]:
    """Per-round accuracy, conformity and drift, read density, transitions and flips of the debating methods."""
    n_rounds = max(r.summary.n_rounds for r in debates)
    lines = [("Per-round accuracy (plurality of each round; a tie scores the share of tied answers that "
              "are correct):"), ""]
    lines += _table(["Method"] + [f"round {k}" for k in range(n_rounds)],
                    [[r.label] + [_pct(x) for x in r.summary.round_accuracy] +
                     ["–"] * (n_rounds - len(r.summary.round_accuracy)) for r in debates]) + [""]
    lines += [("Conformity (agent-round cases; rate % (numerator/denominator)), drift (problem-drift FOCUS on "
              "the per-round group answer):"), ""]
    lines += _table(
        ["Method", "HCR", "BCR", "HCR narrow", "BCR narrow", "drifted debates", "recovered",
         "mean rounds drifted", "improved / degraded", "mean FOCUS per round"],
        [[r.label, _ratio(r.summary.hcr), _ratio(r.summary.bcr), _ratio(r.summary.hcr_narrow),
          _ratio(r.summary.bcr_narrow), _ratio(r.summary.drifted),
          _ratio(r.summary.recovered), f"{r.summary.mean_rounds_drifted:.2f}",
          f"{r.summary.improved} / {r.summary.degraded}",
          ", ".join(f"{x:+.3f}" for x in r.summary.focus)] for r in debates],
    ) + [""]
    lines += ["Read density per exchange round (peers read / (V − 1), mean over agents and debates):", ""]
    lines += _table(["Method"] + [f"round {k}" for k in range(1, n_rounds)],
                    [[r.label] + [_pct(x) for x in r.summary.read_density] +
                     ["–"] * (n_rounds - 1 - len(r.summary.read_density)) for r in debates]) + [""]
    lines += ["Transitions per agent (counts, round r → r+1):", ""]
    rows = []
    for r in debates:
        for k, counts in enumerate(r.summary.transitions):
            rows.append([r.label, f"{k}→{k + 1}"] + [str(int(c)) for c in counts])
    lines += _table(["Method", "rounds"] + [t.replace("->", "→") for t in TRANSITIONS], rows) + [""]
    peers = sorted({k for r in debates for k in r.summary.flips_by_agreement})
    lines += ["C→I rate by the number of peers sharing the (correct) agent's answer, % (flips/cases):", ""]
    return lines + _table(["Method"] + [f"{k} agreeing" for k in peers],
                          [[r.label] + [_ratio(r.summary.flips_by_agreement.get(k, Ratio(0, 0))) for k in peers]
                           for r in debates]) + [""]


def _failures_section(results: Sequence[MethodResult], meta: dict[str, Any],
                      failures: dict[tuple[str, str], list[tuple[str, str]]]) -> list[str]:
    remaining = {k: v for k, v in failures.items() if v}
    if not remaining:
        return []
    lines = ["## Failed debates that remain", "",
             ("A backend error ended these debates; they are not in the accuracy above, and running the same "
              "command again retries them."), ""]
    return lines + _table(["Benchmark", "Method", "Question", "Error"],
                          [[b, meta.get("labels", {}).get(m) or by_label(results, m), q,
                            (err or "")[:160].replace("|", "/")]
                           for (b, m), items in sorted(remaining.items()) for q, err in items]) + [""]


DEFINITIONS = [
    "## Definitions", "",
    ("- Final answer: plurality over the last round's parsed answers; equivalent answers vote together "
     "(the grader's equivalence: `5/4` = `1.25`). " + TIE_RULE + " A seeded random pick among tied "
     "leaders names the answer a user gets; its accuracy is the \"seeded tie pick\" column. No parsable "
     "answer never votes (nor does a letter that is not an option); a debate where no agent answered "
     "scores 0."),
    ("- HCR: among (agent, round r→r+1) cases where the agent is correct, holds an answer fewer agents "
     "share than the plurality answer, and no plurality answer is correct — the share wrong at r+1. "
     "BCR: the agent is wrong (with an answer), in the minority, and the plurality is correct — the "
     "share correct at r+1. Agents without an answer and mixed ties enter neither."),
    ("- Drift: s_r = per-round group score, FOCUS_r = s_r − s_(r−1); a debate has drifted at round r "
     "when s_r is below the best earlier round; it recovered when a later round reaches the pre-drift "
     "best. Rates with an empty denominator are shown as –."),
    ("- HCR narrow / BCR narrow (the paper's reading): the same cases restricted to agents that read at "
     "least one peer in round r+1; harmful = the agent adopts the round-r plurality's wrong answer, "
     "beneficial = it adopts the plurality's correct answer."),
    ("- A completion cut at the token limit (finish_reason \"length\") gives an answer only where it "
     "marked one (a complete \\boxed{} or an answer phrase); otherwise it counts as no answer."),
    ("- MAD stop-when-unanimous ends a debate after the first round (0, 1, …) where every agent gave the "
     "same answer; it is charged only the rounds it ran, and its per-round accuracy counts the debates "
     "still running at that round."),
    ("- Failed debates (a backend error) are not finished: they are left out of the accuracy, listed, "
     "and retried by the same command."),
    ""]


def _agent_section(results: Sequence[MethodResult]) -> list[str]:
    """The per-agent table of a mixed pool (`meta["agent_profiles"]`): each method's agents with their profile."""
    lines = ["## Per agent", "",
             ("Each agent of each method: its profile (a round 0 wider than the pool continues it in order), its tokens "
              "per question (prompt + completion of its own calls), and the share of its answers that are correct in "
              "round 0 and in the last round its debate ran (no answer counts as wrong)."), ""]
    rows = [[r.benchmark, r.label, str(a.agent), f"`{a.profile}`", str(a.n), f"{a.tokens:,.0f}",
             _pct(a.round0_accuracy), _pct(a.final_accuracy)] for r in results for a in r.agents]
    lines += _table(["Benchmark", "Method", "Agent", "Profile", "n", "tokens/q", "round-0 acc %",
                     "last-round acc %"], rows) + [""]
    stepped = [r for r in results if r.steps]
    if not stepped:
        return lines
    lines += ["Who moved to whose answer (eval/profile_transitions.py): every agent's step from one round to the next, "
              "by its profile and the profiles it read; C→I among steps from a correct answer, I→C among steps from "
              "a wrong one; adopted = moved to an answer a peer it read gave, by that peer's profile (correct ones "
              "in brackets).", ""]
    rows = [[r.benchmark, r.label, f"`{s.profile}`", s.read if s.read == NOBODY else f"`{s.read}`", str(s.n),
             _ratio(Ratio(s.correct_to_incorrect, s.was_correct)), _ratio(Ratio(s.incorrect_to_correct, s.was_incorrect)),
             str(s.moved), "; ".join(f"`{q}` {k} ({c})" for q, (k, c) in sorted(s.adopted.items())) or "–"]
            for r in stepped for s in r.steps]
    return lines + _table(["Benchmark", "Method", "Agent's profile", "Read", "steps", "C→I % (k/n)", "I→C % (k/n)",
                           "moved", "adopted from"], rows) + [""]


def _paired_diffs(by: dict[tuple[str, str], MethodResult], benchmarks: Sequence[str], method: str, baseline: str,
                  seed: int, n_boot: int) -> list[str]:
    """`method` − `baseline` accuracy per benchmark on their common questions, as "+d [lo, hi]" cells."""
    cells = []
    for b in benchmarks:
        r, base = by.get((b, method)), by.get((b, baseline))
        common = sorted(set(r.correct_by_question) & set(base.correct_by_question)) if r and base else []
        if not common:
            cells.append("–")
            continue
        d = paired_bootstrap_diff([r.correct_by_question[q] for q in common],
                                  [base.correct_by_question[q] for q in common], seed=seed, n_boot=n_boot)
        cells.append(f"{100 * d.mean:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}]")
    return cells


def by_label(results: Sequence[MethodResult], method: str) -> str:
    return next((r.label for r in results if r.method == method), method)


# ---------------------------------------------------------------- re-grading note
def read_regrade_record(root: Path) -> dict[str, Any] | None:
    """The directory's regrade.json (eval.regrade), or None."""
    path = Path(root) / REGRADE_RECORD
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def questions_then(record: dict[str, Any], key: str, before: str = "before") -> int | None:
    """How many questions row `key` had when its `before` accuracy was published (the summary's n, as the record
    stored it; None for a record older than that, which `eval.regrade` did not yet keep)."""
    stored = record.get(f"{before}_n", {}).get(key)
    return int(stored) if stored is not None else None


def moved_note(record: dict[str, Any], accuracy: dict[str, tuple[float, float]],
               before: str = "before", n_now: Mapping[str, int] | None = None) -> list[str]:
    """Markdown lines of the "what moved" note of a re-graded directory: per row, the accuracy its report
    published before the first re-grade (seeded tie pick, the old parser) and today's (ties as expected
    values; seeded pick, NaN where not computed). With `n_now`, each row also says on how many questions each
    was measured: a directory that gained questions after its re-grade compares two question sets."""
    first, last = record["runs"][0], record["runs"][-1]
    turns = sum(f["turns_changed"] for f in first["files"].values())
    finals = sum(len(f["finals_changed"]) for f in first["files"].values())
    lines = [f"## Re-graded on {first['date']}: what moved", "",
             ("`python -m eval.regrade` re-parsed every stored completion with the own-answer parser (never an "
              "echoed peer answer or template example; a letter that is not an option is no answer), grouped "
              "equivalent answers and voted again with ties as expected values; no model was called. It changed "
              f"{turns} agent answers or grades and the final answer of {finals} debates (every trace file, "
              f"retried debates included). Math equivalence checks: {last['math_equivalence_checks']}; undecided "
              f"(timeout or error, counted as different answers): {last['math_equivalence_undecided']}."), ""]
    for run in record["runs"][1:]:  # later re-grades that named vote rules (older records name none: not listed)
        if run.get("vote_rules"):
            flags = " ".join(f"--vote-rule {rule}" if name == "*" else f"--vote-rule {name}={rule}"
                             for name, rule in run["vote_rules"].items())
            lines += [(f"Re-graded again on {run['date']} with the vote rules named for the traces that recorded none "
                       f"(`{flags}`): it changed {sum(f['turns_changed'] for f in run['files'].values())} agent "
                       f"answers or grades, the final answer of "
                       f"{sum(len(f['finals_changed']) for f in run['files'].values())} debates and the score (ties "
                       f"as expected values) of {sum(len(f.get('scores_changed', [])) for f in run['files'].values())}"
                       "; \"now\" is after it."), ""]
    header = ["Row", "accuracy % before (seeded tie pick, old parser)", "now (ties as expected values)",
              "now (seeded tie pick)"]
    if n_now is not None:
        lines += [("Questions then → now: where they differ, the directory gained questions after the re-grade and "
                   "the two accuracies are of different question sets (not a change the re-grade made)."), ""]
        header.append("questions then → now")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, (expected, seeded) in accuracy.items():
        old = record.get(before, {}).get(key)
        cells = [key, _pct(old) if old is not None else "–", _pct(expected), _pct(seeded)]
        if n_now is not None:
            then = questions_then(record, key, before) if old is not None else None
            cells.append(f"{then if then is not None else '–'} → {n_now.get(key, '–')}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]
