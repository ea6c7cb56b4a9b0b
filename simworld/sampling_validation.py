"""Do the simulator's independent samples vote like the real model's? Sampling rules on real fresh samples vs the
fitted world, out of sample (issue 39, item 4).

    python -m simworld.sampling_validation --samples results/fresh-samples-gsm8k

Real side: the wide round 0s of `simworld.fresh_samples` (GSM8K train questions the dynamics fit never saw).
Simulated side (SYNTHETIC): the world of `--world` (default configs/sim.yaml, the fitted world) draws the same
wide round 0 (same width, T, top-p, token limit) on `--sim-questions` of its synthetic questions.

Both sides go through one function, `rule_outcome` (`dear.debate.sampling_rules`, also behind `eval.run`'s
adaptive self-consistency), which reads a question's samples in order:
- `cot`: the first sample; `sc-k`: the plurality over the first k (sc-3 is the round-0 majority of 3 agents);
- `adaptive-sc-a`: start from the first 3 (round 0), add one sample at a time until `a` samples share an answer
  or all are used, then the plurality over those used — the decisions of `dear.debate.protocols.SamplingRuleProtocol`
  (its fresh turns send the wide round 0's requests: the same samples on a backend whose answer depends only on
  the request, tests/dear/debate/test_sampling_rules.py; on the sim backend the same only in distribution).
Accuracy is the vote's expected correctness over tied leaders (`dear.vote`, the project's tie rule); tokens are
prompt + completion of the samples a rule used. The real side's intervals are Wilson 95 % over questions (a tie's
fractional score rounded, as in `simworld.validation`); the simulated side's are too, over its questions. Also
compared: how often the first 3 agree (what MAD-stop's stop sees), the spread of correct samples per question
(the per-question difficulty the sim draws), and how often two wrong samples share an answer (the wrong-answer
concentration behind every vote).

Writes `--out` (default SAMPLES/validation): `sampling_validation.md` and `.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dear import tasks
from dear.atomic import atomic_write_text, write_json
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.protocols import MajorityProtocol
from dear.debate.sampling_rules import (  # noqa: F401  (Outcome, samples_used: re-exported, the rules' old home)
    AGREEMENT_STATES,
    ROUND0_AGENTS,
    Outcome,
    Samples,
    agreement_of,
    rule_outcome,
    rules_for,
    samples_used,
)
from dear.debate.trace import DebateTrace
from dear.vote import tally
from simworld.corpus import CorpusFile
from simworld.fresh_samples import SAMPLES_FILE
from simworld.validation import wilson

log = logging.getLogger("simworld.sampling_validation")
PROG = "python -m simworld.sampling_validation"


@dataclass(frozen=True)
class RuleRow:
    rule: str
    accuracy: float
    ci_low: float
    ci_high: float
    samples: float  # mean samples used
    tokens: float  # mean tokens per question


def rule_rows(questions: Sequence[Samples], rules: Sequence[str]) -> list[RuleRow]:
    rows = []
    for rule in rules:
        outs = [rule_outcome(s, rule) for s in questions]
        acc = float(np.mean([o.score for o in outs]))
        lo, hi = wilson(acc * len(outs), len(outs))
        rows.append(RuleRow(rule, acc, lo, hi, float(np.mean([o.used for o in outs])),
                            float(np.mean([o.tokens for o in outs]))))
    return rows


def describe(questions: Sequence[Samples]) -> dict[str, Any]:
    """The shape behind the votes: first-3 agreement, correct samples per question, wrong-answer collisions."""
    width = min(len(s.keys) for s in questions)
    n_correct = np.array([sum(s.correct[:width]) for s in questions])
    first3 = [tally(s.keys[:ROUND0_AGENTS]).top == ROUND0_AGENTS for s in questions]
    pairs = same = 0
    for s in questions:
        wrong = [k for k, c in zip(s.keys[:width], s.correct[:width]) if not c]
        for i in range(len(wrong)):
            for j in range(i + 1, len(wrong)):
                pairs += 1
                same += wrong[i] is not None and wrong[i] == wrong[j]
    return {
        "questions": len(questions),
        "width": width,
        "sample_accuracy": float(n_correct.mean() / width),
        "first3_unanimous": float(np.mean(first3)),
        # by the slot a sample would take in a V = 3 debate (k mod 3): the sim gives each slot its own fitted skill
        "accuracy_by_slot": [float(np.mean([c for s in questions for k, c in enumerate(s.correct[:width])
                                            if k % ROUND0_AGENTS == slot])) for slot in range(ROUND0_AGENTS)],
        "correct_per_question": [int((n_correct == k).sum()) for k in range(width + 1)],
        "wrong_pairs": pairs,
        "wrong_pairs_same_answer": float(same / pairs) if pairs else float("nan"),
    }


STATE_RULES = ("sc-3", "adaptive-sc-2", "adaptive-sc-3", "sc-9")


def agreement_state(s: Samples) -> str:
    """How the first 3 samples agree (round 0 of a V = 3 debate)."""
    return agreement_of(s.keys[:ROUND0_AGENTS])


def by_state(questions: Sequence[Samples], rules: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per round-0 agreement state: its share of questions and each rule's accuracy there (the value of more
    samples where the regulator decides whether to draw them)."""
    out = {}
    for state in AGREEMENT_STATES:
        group = [s for s in questions if agreement_state(s) == state]
        out[state] = {"questions": len(group), "share": len(group) / len(questions),
                      "accuracy": {r: float(np.mean([rule_outcome(s, r).score for s in group])) if group
                                   else float("nan") for r in rules}}
    return out


# ---------------------------------------------------------------- the two sides
def real_samples(samples_dir: Path) -> list[Samples]:
    recs = CorpusFile(samples_dir / SAMPLES_FILE).records
    if not recs:
        raise ValueError(f"{samples_dir / SAMPLES_FILE}: no samples yet (run python -m simworld.fresh_samples)")
    return [Samples.of(DebateTrace.from_dict(r["trace"])) for r in recs]


def sim_samples(world: Path, n: int, width: int, settings: dict[str, Any], seed: int) -> list[Samples]:
    """A wide round 0 in the simulated world, with the real run's sampling settings (SYNTHETIC)."""
    from dear.llm.registry import make_backend

    cfg = yaml.safe_load(world.read_text())
    llm = cfg.get("llm") or {}
    if llm.get("preset") != "sim":
        raise ValueError(f"{world}: llm.preset is {llm.get('preset')!r}; this check needs a sim world")
    backend = make_backend("sim", **(llm.get("options") or {}))
    env = cfg.get("env") or {}
    qs = tasks.load(env.get("task", "synthetic"), split=env.get("split", "train"), n=n, seed=seed)
    engine = DebateEngine(backend, DebateConfig(n_agents=width, n_rounds=0, temperature0=settings["temperature"],
                                                top_p0=settings["top_p"], max_tokens=settings["max_tokens"],
                                                seed=seed, layout=settings["layout"]))
    return [Samples.of(d.trace) for d in engine.run(qs, MajorityProtocol())]


# ---------------------------------------------------------------- report
def report(real: Sequence[Samples], sim: Sequence[Samples], meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    width = min(len(s.keys) for s in real)
    rules = rules_for(width)
    rows_real, rows_sim = rule_rows(real, rules), rule_rows(sim, rules)
    d_real, d_sim = describe(real), describe(sim)
    lines = [
        "# Fresh samples: the fitted simulator (SYNTHETIC) vs the real model",
        "",
        f"Command: `{meta['command']}` (sim seed {meta['seed']}). Real: {len(real)} GSM8K **train** questions the "
        f"dynamics fit never saw, {width} samples each (`{meta['samples']}`, model `{meta['llm']}`). Simulated: "
        f"{len(sim)} synthetic questions of `{meta['world']}`, labelled *sim (synthetic)* in every row. Accuracy in "
        "% (ties as expected values) with Wilson 95 % intervals over questions; tokens = prompt + completion of "
        "the samples used.",
        "",
        "| rule | real accuracy | sim (synthetic) accuracy | sim inside real CI | real samples | sim (synthetic) "
        "samples | real tokens/q | sim (synthetic) tokens/q |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, s in zip(rows_real, rows_sim):
        inside = "yes" if r.ci_low <= s.accuracy <= r.ci_high else "**no**"
        lines.append(f"| {r.rule} | {100 * r.accuracy:.1f} [{100 * r.ci_low:.1f}, {100 * r.ci_high:.1f}] | "
                     f"{100 * s.accuracy:.1f} [{100 * s.ci_low:.1f}, {100 * s.ci_high:.1f}] | {inside} | "
                     f"{r.samples:.2f} | {s.samples:.2f} | {r.tokens:,.0f} | {s.tokens:,.0f} |")
    lines += [
        "",
        "| shape | real | sim (synthetic) |",
        "|---|---|---|",
        f"| one sample's accuracy | {100 * d_real['sample_accuracy']:.1f} % | {100 * d_sim['sample_accuracy']:.1f} % |",
        "| one sample's accuracy by debate slot (sample k in slot k mod 3) | "
        + " / ".join(f"{100 * a:.1f} %" for a in d_real["accuracy_by_slot"]) + " | "
        + " / ".join(f"{100 * a:.1f} %" for a in d_sim["accuracy_by_slot"]) + " |",
        f"| first 3 samples unanimous (MAD-stop stops) | {100 * d_real['first3_unanimous']:.1f} % | "
        f"{100 * d_sim['first3_unanimous']:.1f} % |",
        f"| two wrong samples give the same answer | {100 * d_real['wrong_pairs_same_answer']:.1f} % "
        f"({d_real['wrong_pairs']} pairs) | {100 * d_sim['wrong_pairs_same_answer']:.1f} % "
        f"({d_sim['wrong_pairs']} pairs) |",
        "",
        "By how the first 3 samples agree (the state after round 0, where a regulator decides whether more samples "
        "are worth their tokens): share of questions and accuracy in % (real without intervals: few questions per "
        "state).",
        "",
        "| first 3 | side | questions | " + " | ".join(STATE_RULES) + " | sc-9 − sc-3 |",
        "|---|---|---:|" + "---:|" * (len(STATE_RULES) + 1),
    ]
    state_rules = [r for r in STATE_RULES if r in rules]
    s_real, s_sim = by_state(real, state_rules), by_state(sim, state_rules)
    for state in AGREEMENT_STATES:
        for side, table in (("real", s_real), ("sim (synthetic)", s_sim)):
            row = table[state]
            acc = row["accuracy"]
            gain = acc.get("sc-9", float("nan")) - acc.get("sc-3", float("nan"))
            lines.append(f"| {state} | {side} | {row['questions']} ({100 * row['share']:.0f} %) | "
                         + " | ".join(f"{100 * acc.get(r, float('nan')):.1f}" for r in STATE_RULES)
                         + f" | {100 * gain:+.1f} |")
    lines += [
        "",
        f"Questions by correct samples out of {width} (share of questions):",
        "",
        "| correct | " + " | ".join(str(k) for k in range(width + 1)) + " |",
        "|---|" + "---|" * (width + 1),
        "| real | " + " | ".join(f"{100 * c / len(real):.0f} %" for c in d_real["correct_per_question"]) + " |",
        "| sim (synthetic) | " + " | ".join(f"{100 * c / len(sim):.0f} %" for c in d_sim["correct_per_question"])
        + " |",
        "",
    ]
    data = {"meta": meta, "rules": {"real": [asdict(r) for r in rows_real], "sim_synthetic": [asdict(r) for r in rows_sim]},
            "shape": {"real": d_real, "sim_synthetic": d_sim},
            "by_round0_agreement": {"real": s_real, "sim_synthetic": s_sim}}
    return "\n".join(lines), data


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", default="results/fresh-samples-gsm8k", help="a simworld.fresh_samples directory")
    p.add_argument("--world", default="configs/sim.yaml", help="the simulated world's config (default %(default)s)")
    p.add_argument("--sim-questions", type=int, default=2000, help="simulated questions (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the simulated side's seed (default %(default)s)")
    p.add_argument("--out", help="report directory (default SAMPLES/validation)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    require_at_least(a, 1, "sim_questions")
    t0 = time.perf_counter()
    samples_dir = Path(a.samples)
    if not (samples_dir / "settings.json").exists():
        raise FileNotFoundError(f"{samples_dir}/settings.json: not a simworld.fresh_samples directory")
    settings = json.loads((samples_dir / "settings.json").read_text())
    real = real_samples(samples_dir)
    sim = sim_samples(Path(a.world), a.sim_questions, settings["width"], settings, a.seed)
    meta = {"command": command_line(PROG, argv), "samples": str(samples_dir), "world": a.world, "seed": a.seed,
            "llm": settings["llm"], "real_questions": len(real), "sim_questions": len(sim)}
    text, data = report(real, sim, meta)
    out = Path(a.out) if a.out else samples_dir / "validation"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "sampling_validation.md", text + f"\nCPU: {time.perf_counter() - t0:.0f} s.\n")
    write_json(out / "sampling_validation.json", data, indent=2, trailing_newline=True)
    print(text)
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
