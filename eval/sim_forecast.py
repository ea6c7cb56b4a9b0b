"""`python -m eval.sim_forecast`: what a fitted world forecast for a real evaluation's rule methods, set beside what
the real evaluation measured — an out-of-sample check of the world on the methods a policy is compared with.

    python -m eval.sim_forecast results/eval-gsm8k-mixed-n60 \\
        --params worlds/gsm8k-mixed/sim_params_synthetic_texts.json --text-bank worlds/gsm8k-mixed/text_bank.json.gz \\
        --methods cot,majority,mad,read-strongest --n 500 --out results/eval-gsm8k-mixed/sim-forecast

The real directory's settings (agents and their profiles, rounds, token limit, sampling, layout, seed; its
`run.json`) are replayed by `eval.run` on `--n` synthetic questions (its task `synthetic`) with the simulated backend of the given
world (every agent's profile on the `sim` backend, same style and token limit), into ``OUT/sim/`` (an ordinary
`eval.run` directory, labelled synthetic, without a response cache; the same command resumes it). The sim's questions are not the real ones,
so the two are compared by what each measures on its own questions: every method's accuracy and its paired
difference from the round-0 majority (ties as expected values), and the per-profile step rates (C→I, I→C, answers
adopted) of every debate method. Written to ``OUT/sim_forecast.md`` and ``.json``: a forecast "holds" where the
sim's point estimate lies inside the real 95 % interval (paired bootstrap for differences, Wilson for rates).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy.stats import binomtest

from dear.atomic import write_json
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.debate.profiles import AgentProfile, parse_profile, without_backend
from dear.metrics import paired_bootstrap_diff
from eval import combine, report
from eval import run as eval_run
from eval.profile_transitions import NOBODY, ProfileStep

BASELINE = "majority"  # every difference is from the round-0 majority, which every debate method starts from


@dataclass(frozen=True)
class Difference:
    """A method's accuracy and its paired difference from the round-0 majority on one side (real or sim)."""

    n: int
    accuracy: float
    minus_majority: float
    low: float
    high: float


@dataclass(frozen=True)
class StepRate:
    """One step rate of agents of one profile that read one set of profiles: k of n."""

    method: str
    profile: str  # the agent's style (the backend left out: the real and sim pools differ only there)
    read: str
    rate: str  # C→I | I→C | adopted
    real_k: int
    real_n: int
    sim_k: int
    sim_n: int

    def real_interval(self) -> tuple[float, float]:
        if not self.real_n:
            return 0.0, 1.0
        ci = binomtest(self.real_k, self.real_n).proportion_ci(confidence_level=0.95, method="wilson")
        return float(ci.low), float(ci.high)

    def holds(self) -> bool | None:
        if not self.real_n or not self.sim_n:
            return None
        low, high = self.real_interval()
        return bool(low <= self.sim_k / self.sim_n <= high)


def sim_profile(name: str) -> str:
    """A real pool's profile on the simulated backend: same style and token limit."""
    p = parse_profile(name)
    return AgentProfile("sim", p.style, p.max_tokens).name


def style_of(name: str) -> str:
    """`local:direct:64` -> `direct:64`; profiles joined by "+" each lose their backend."""
    if name == NOBODY:
        return name
    return "+".join(sorted(without_backend(n) for n in name.split("+")))


def sim_argv(settings: dict[str, Any], methods: Sequence[str], n: int, out: Path, params: Path,
             text_bank: Path | None = None) -> list[str]:
    """The `eval.run` arguments that replay a real directory's settings in the simulated world."""
    pool = combine.pool_of(settings)
    argv = ["--benchmarks", "synthetic", "--n", str(n), "--llm", "sim", "--methods", ",".join(methods),
            "--agent-profiles", ",".join(sim_profile(p) for p in pool), "--sim-params", str(params),
            *(["--sim-text-bank", str(text_bank)] if text_bank is not None else []), "--out", str(out),
            "--no-progress", "--no-cache"]  # the world answers a seeded request alike every time
    for key, flag in (("seed", "--seed"), ("n_rounds", "--n-rounds"), ("max_tokens", "--max-tokens"),
                      ("temperature", "--temperature"), ("top_p", "--top-p"), ("layout", "--layout"),
                      ("sc_samples", "--sc-samples")):
        if settings.get(key) is not None:
            argv += [flag, str(settings[key])]
    return argv


def differences(results: Sequence[report.MethodResult], seed: int, n_boot: int) -> dict[str, Difference]:
    """Each method's accuracy and paired difference from the round-0 majority, on their common questions."""
    by = {r.method: r for r in results}
    if BASELINE not in by:
        raise ValueError(f"the forecast compares with the round-0 majority: method {BASELINE!r} is missing")
    base = by[BASELINE].correct_by_question
    out = {}
    for method, r in by.items():
        common = sorted(set(r.correct_by_question) & set(base))
        d = paired_bootstrap_diff([r.correct_by_question[q] for q in common], [base[q] for q in common],
                                  seed=seed, n_boot=n_boot)
        out[method] = Difference(len(common), sum(r.correct_by_question[q] for q in common) / len(common),
                                 float(d.mean), float(d.low), float(d.high))
    return out


def _by_style(steps: Sequence[ProfileStep]) -> dict[tuple[str, str], ProfileStep]:
    merged: dict[tuple[str, str], ProfileStep] = {}
    for s in steps:
        key = (style_of(s.profile), style_of(s.read))
        m = merged.setdefault(key, ProfileStep(*key))
        m.n += s.n
        m.was_correct += s.was_correct
        m.correct_to_incorrect += s.correct_to_incorrect
        m.was_incorrect += s.was_incorrect
        m.incorrect_to_correct += s.incorrect_to_correct
        m.moved += s.moved
        for source, (k, c) in s.adopted.items():
            a = m.adopted.setdefault(style_of(source), [0, 0])
            a[0] += k
            a[1] += c
    return merged


def step_rates(real: Sequence[report.MethodResult], sim: Sequence[report.MethodResult]) -> list[StepRate]:
    """C→I, I→C and adoption rates by (profile, profiles read) for every method both sides ran, real beside sim."""
    sim_by = {r.method: r for r in sim}
    rows = []
    for r in real:
        if r.method not in sim_by or not r.steps:
            continue
        rs, ss = _by_style(r.steps), _by_style(sim_by[r.method].steps)
        for key in rs:
            a, b = rs[key], ss.get(key, ProfileStep(*key))
            rows.append(StepRate(r.method, *key, "C→I", a.correct_to_incorrect, a.was_correct,
                                 b.correct_to_incorrect, b.was_correct))
            rows.append(StepRate(r.method, *key, "I→C", a.incorrect_to_correct, a.was_incorrect,
                                 b.incorrect_to_correct, b.was_incorrect))
            rows.append(StepRate(r.method, *key, "adopted", sum(k for k, _ in a.adopted.values()), a.n,
                                 sum(k for k, _ in b.adopted.values()), b.n))
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _signed(d: Difference) -> str:
    return f"{100 * d.minus_majority:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}]"


def markdown(real_dir: Path, sim_dir: Path, labels: dict[str, str], real: dict[str, Difference],
             sim: dict[str, Difference], rates: Sequence[StepRate], command: str) -> str:
    methods = [m for m in real if m in sim]
    lines = [f"# The fitted world's forecast of `{real_dir}` (sim columns SYNTHETIC)", "",
             f"Command: `{command}`", "",
             f"Real: `{real_dir}` (its questions, {real[BASELINE].n} of them). Sim (synthetic): `{sim_dir}` — the same "
             f"settings on {sim[BASELINE].n} synthetic questions in the fitted world. The questions differ, so "
             "each side is measured on its own; a forecast **holds** where the sim's point estimate lies inside the "
             "real 95 % interval. Differences are paired bootstrap intervals from the round-0 majority (ties as "
             "expected values).", "",
             "| method | real acc % | sim acc % (synthetic) | real − round-0 majority [95 % CI] | "
             "sim − round-0 majority [95 % CI] (synthetic) | holds |", "|---|---:|---:|---|---|---|"]
    for m in methods:
        holds = "–" if m == BASELINE else ("yes" if real[m].low <= sim[m].minus_majority <= real[m].high else "**no**")
        lines.append(f"| {labels.get(m, m)} | {_pct(real[m].accuracy)} | {_pct(sim[m].accuracy)} | {_signed(real[m])} | "
                     f"{_signed(sim[m])} | {holds} |")
    lines += ["", "## Steps by profile and profiles read", "",
              "Every agent's step from one round to the next (eval/profile_transitions.py), by its style and the styles "
              "it read: C→I among steps from a correct answer, I→C among steps from a wrong one, adopted = moved to an "
              "answer a read peer gave, among all steps. Real: k/n with a Wilson 95 % interval.", "",
              "| method | agent | read | rate | real % (k/n) [95 % CI] | sim % (k/n) (synthetic) | holds |",
              "|---|---|---|---|---|---|---|"]
    for s in rates:
        low, high = s.real_interval()
        real_cell = f"{_pct(s.real_k / s.real_n) if s.real_n else '–'} ({s.real_k}/{s.real_n}) [{_pct(low)}, {_pct(high)}]"
        sim_cell = f"{_pct(s.sim_k / s.sim_n) if s.sim_n else '–'} ({s.sim_k}/{s.sim_n})"
        holds = {None: "–", True: "yes", False: "**no**"}[s.holds()]
        lines.append(f"| {labels.get(s.method, s.method)} | `{s.profile}` | `{s.read}` | {s.rate} | {real_cell} | "
                     f"{sim_cell} | {holds} |")
    return "\n".join(lines) + "\n"


def forecast(real_dir: Path, params: Path, text_bank: Path | None, methods: Sequence[str] | None, n: int, out: Path,
             seed: int = 0, n_boot: int = 2000, command: str = "") -> dict[str, Any]:
    """Replay the real directory's settings in the world, compare, write OUT/sim_forecast.md and .json."""
    source = combine.read_source(real_dir)
    if source.synthetic:
        raise ValueError(f"{real_dir}: a synthetic directory; the forecast is checked against a real evaluation")
    stored = json.loads((real_dir / "run.json").read_text())
    settings = stored.get("settings") or {}
    real_results = combine.report_source(source)
    available = [r.method for r in real_results if not r.method.startswith("dear")]
    chosen = list(methods) if methods else available
    missing = [m for m in chosen if m not in available]
    if missing:
        raise ValueError(f"--methods: {', '.join(missing)} not among {real_dir}'s rule methods ({', '.join(available)})")
    if BASELINE not in chosen:
        chosen.insert(0, BASELINE)
    if not params.is_file():
        raise ValueError(f"--params: no such file {params}")
    if text_bank is not None and not text_bank.is_file():
        raise ValueError(f"--text-bank: no such file {text_bank}")
    sim_dir = out / "sim"
    sim_results = eval_run.main(sim_argv(settings, chosen, n, sim_dir, params, text_bank))
    real_chosen = [r for r in real_results if r.method in chosen]
    real_d = differences(real_chosen, seed, n_boot)
    sim_d = differences(sim_results, seed, n_boot)
    rates = step_rates(real_chosen, sim_results)
    labels = {r.method: r.label for r in real_chosen}
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim_forecast.md").write_text(markdown(real_dir, sim_dir, labels, real_d, sim_d, rates, command),
                                         encoding="utf-8")
    record = {"command": command, "real": str(real_dir), "sim": str(sim_dir), "params": str(params),
              "text_bank": str(text_bank) if text_bank else None, "synthetic_columns": ["sim"],
              "methods": {m: {"real": vars(real_d[m]), "sim_synthetic": vars(sim_d[m])} for m in real_d if m in sim_d},
              "step_rates": [vars(s) | {"holds": s.holds()} for s in rates]}
    write_json(out / "sim_forecast.json", record, indent=1)
    return record


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m eval.sim_forecast", description=__doc__.split("\n\n")[0])
    p.add_argument("real", type=Path, help="a real eval.run results directory")
    p.add_argument("--params", type=Path, required=True, help="the fitted world's SimParams JSON")
    p.add_argument("--text-bank", type=Path, help="the world's text bank (text_bank.json.gz), if it has one")
    p.add_argument("--methods", help="comma-separated rule methods of the real directory (default: all of them)")
    p.add_argument("--n", type=int, default=500, help="synthetic questions (default 500)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--out", type=Path, required=True, help="output directory (OUT/sim holds the sim's eval.run)")
    a = p.parse_args(argv)
    methods = [m.strip() for m in a.methods.split(",") if m.strip()] if a.methods else None
    record = forecast(a.real, a.params, a.text_bank, methods, a.n, a.out, a.seed, a.n_boot,
                      command_line("python -m eval.sim_forecast", list(argv) if argv is not None else None))
    print((a.out / "sim_forecast.md").read_text(encoding="utf-8"))
    return record


if __name__ == "__main__":
    run_cli(main, "python -m eval.sim_forecast")
