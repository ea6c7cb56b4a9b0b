"""The first simulator fit (superseded by `python -m simworld.fit`): maximum a posteriori on a trace file, and the
random-schedule collection it was run on. Kept because `results/sim_fit/` was made by it.

    # fit SimParams to debate traces (JSONL of DebateTrace.to_dict()), compare fitted sim vs real
    python -m simworld.map_fit --traces results/sim_fit/traces_real_local.jsonl \\
        [--out results/sim_fit/params_synthetic_fit.json] [--report results/sim_fit/fit_report.md]

    # run the real model on N GSM8K test questions with random masks and temperatures, write the traces
    python -m simworld.map_fit --collect 16 --llm local [--n-rounds 1] [--max-tokens 384] [--seed 0] [--fit]

What is estimated (all from the traces' rounds[r][agent]: answer_key, correct, temperature, top_p, peers):
- observed rates: round-0 accuracy and unanimity; correct→incorrect (C→I) and incorrect→correct (I→C) rates
  of every (agent, round r → r+1) transition, sliced by how many of the peers it read shared its answer
  ("read none", 0, 1, 2+) and by the temperature of the new turn;
- round-0 parameters (difficulty centre/scale, per-agent skill, temperature penalty): maximum a posteriori
  under the sim's model, the question difficulty integrated out on a grid (δ ~ U(0, 1));
- wrong-answer concentration (p_unique_wrong, distractor_decay): matched to how often two wrong round-0 answers
  to the same question coincide;
- exchange-round parameters (a0..a3, s0, s1, p_resolve, resolve_bonus): MAP of the sim's exact transition
  likelihood (outcomes: correct / same wrong answer / other wrong answer), each question's difficulty
  integrated out jointly with its round-0 answers.
Gaussian priors centred on the defaults keep small logs (tens of transitions) from producing wild values; a
parameter the logs cannot inform (e.g. top_p_weight when top-p never varied) stays at its default.
For a corpus use `python -m simworld.fit` instead: joint maximum likelihood of every parameter with no priors
(`simworld.mle.fit_mle`), an identification report, and out-of-sample validation.
The fitted sim is then replayed on the same schedules (same per-agent temperatures, top-p and peer masks,
`--replicates` synthetic questions per logged debate) and its rates are printed beside the real ones.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize

from dear.cli import command_line
from dear.cli import run as run_cli
from dear.debate.cli_args import OMIT, add_backend_args, add_debate_args, add_output_args, add_question_args
from dear.metrics import Ratio
from dear.sim.backend import SimBackend
from dear.sim.likelihood import round0_arrays, round0_loglik_grid, transition_outcomes
from dear.sim.model import distractor_weights, sigmoid
from dear.sim.params import LOG_PREFIX, SimParams
from dear.sim.records import DebateRecord, Transition, read_traces, transitions
from simworld.mle import wrong_pair_agreement
from simworld.rates import compute_stats
from simworld.replay import Schedule, simulate

log = logging.getLogger("simworld.map_fit")
PROG = "python -m simworld.map_fit"
DEFAULT_OUT = "results/sim_fit/params_synthetic_fit.json"
DEFAULT_REPORT = "results/sim_fit/fit_report.md"


# ---------------------------------------------------------------- maximum a posteriori
def fit_distractors(params: SimParams, agreement: Ratio, n_distractors: int = 3) -> SimParams:
    """Match κ = (1 − u)²·Σ w_i² to the observed wrong-pair agreement (u first; λ if u = 0 is not enough)."""
    if agreement.den == 0:
        return params
    kappa = agreement.rate
    s2 = float((distractor_weights(params, n_distractors) ** 2).sum())
    if kappa <= s2:
        return replace(params, p_unique_wrong=float(np.clip(1 - math.sqrt(kappa / s2), 0.0, 0.95)))
    lo, hi = params.distractor_decay, 20.0  # sharpen the distractor weights until Σ w² reaches κ
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if float((distractor_weights(replace(params, distractor_decay=mid), n_distractors) ** 2).sum()) < kappa:
            lo = mid
        else:
            hi = mid
    return replace(params, p_unique_wrong=0.0, distractor_decay=hi)


def fit_round0(records: Sequence[DebateRecord], prior: SimParams) -> tuple[SimParams, dict[str, Any]]:
    """Round-0 parameters (difficulty centre and scale, skills, temperature penalty): MAP, priors on `prior`."""
    arrays = round0_arrays(records)
    V = arrays[0]
    temps = arrays[2][arrays[4]]
    vary_t = float(np.ptp(temps)) > 1e-6 if temps.size else False
    p0 = SimParams.from_dict({**prior.to_dict(), "skills": [prior.skill(a) for a in range(V)]})
    # theta = [center, log scale, temp_penalty, skill deviations (V)]
    theta0 = np.array([p0.difficulty_center, math.log(p0.difficulty_scale), p0.temp_penalty] + [0.0] * V)
    prior_sd = np.array([1.0, 0.5, 0.5] + [0.3] * V)

    def unpack(th: np.ndarray) -> SimParams:
        return replace(p0, difficulty_center=float(th[0]), difficulty_scale=float(math.exp(th[1])),
                       temp_penalty=float(th[2]) if vary_t else p0.temp_penalty,
                       skills=[float(s) for s in th[3:]])

    def nlp(th: np.ndarray) -> float:
        ll = round0_loglik_grid(unpack(th), arrays)
        m = ll.max(1, keepdims=True)
        marg = (m[:, 0] + np.log(np.exp(ll - m).mean(1))).sum()  # ∫ dδ over U(0, 1)
        return float(-marg + 0.5 * (((th - theta0) / prior_sd) ** 2).sum())

    res = minimize(nlp, theta0, method="L-BFGS-B")
    th = res.x
    # skills are only identified relative to the centre: keep their mean in the centre
    fitted = unpack(th)
    mean_skill = float(np.mean(fitted.skills))
    fitted = replace(fitted, skills=[s - mean_skill for s in fitted.skills],
                     difficulty_center=fitted.difficulty_center - mean_skill)
    info = {"round0_converged": bool(res.success), "round0_nlp": float(res.fun), "round0_temperature_varied": vary_t}
    return fitted, info


_TRANS_FIELDS = ("switch_bias", "switch_disagree", "switch_agree", "switch_temp", "self_revise_bias",
                 "self_revise_temp", "p_resolve", "resolve_bonus")
_TRANS_SD = np.array([1.0, 0.7, 0.7, 0.7, 1.0, 0.7, 1.0, 0.7])  # priors (p_resolve on the logit scale)


def _transition_loglik_grid(p: SimParams, trs: Sequence[Transition], kappa: float) -> np.ndarray:
    """(N, G) log-probability of each transition's outcome at each difficulty grid point."""
    return transition_outcomes(p, trs, kappa).log_prob


def fit_transitions(records: Sequence[DebateRecord], base: SimParams, prior: SimParams) -> tuple[SimParams, dict]:
    """Exchange-round parameters: MAP of the transition likelihood given round 0 (fitted in `base`)."""
    trs = transitions(records)
    if not trs:
        return base, {"transitions": 0}
    arrays = round0_arrays(records)
    ll0 = round0_loglik_grid(base, arrays)  # (Q, G), fixed: round-0 parameters are already fitted
    debate_idx = np.array([t.debate for t in trs])
    kappa = (1 - base.p_unique_wrong) ** 2 * float((distractor_weights(base, 3) ** 2).sum())

    def to_theta(p: SimParams) -> np.ndarray:
        v = [getattr(p, f) for f in _TRANS_FIELDS]
        v[6] = math.log(max(v[6], 1e-4) / max(1 - v[6], 1e-4))
        return np.array(v, dtype=np.float64)

    theta0 = to_theta(prior)

    def unpack(th: np.ndarray) -> SimParams:
        vals = {f: float(v) for f, v in zip(_TRANS_FIELDS, th)}
        vals["p_resolve"] = float(sigmoid(th[6]))
        return replace(base, **vals)

    def nlp(th: np.ndarray) -> float:
        llt = _transition_loglik_grid(unpack(th), trs, kappa)  # (N, G)
        per_q = ll0.copy()
        np.add.at(per_q, debate_idx, llt)
        # P(round 0 and transitions of q) / P(round 0 of q): the round-0 part is constant in theta
        m = per_q.max(1, keepdims=True)
        marg = (m[:, 0] + np.log(np.exp(per_q - m).mean(1))).sum()
        return float(-marg + 0.5 * (((th - theta0) / _TRANS_SD) ** 2).sum())

    res = minimize(nlp, theta0, method="L-BFGS-B")
    return unpack(res.x), {"transitions": len(trs), "transitions_converged": bool(res.success),
                           "transitions_nlp": float(res.fun)}


def fit(records: Sequence[DebateRecord], prior: SimParams | None = None) -> tuple[SimParams, dict[str, Any]]:
    """Fit SimParams to the records (priors centred on `prior`, default SimParams())."""
    prior = prior or SimParams()
    p, info = fit_round0(records, prior)
    agreement = wrong_pair_agreement(records)
    p = fit_distractors(p, agreement)
    info["wrong_pair_agreement"] = [agreement.num, agreement.den]
    p, info2 = fit_transitions(records, p, prior)
    info.update(info2)
    return p, info


# ---------------------------------------------------------------- report
def comparison_table(real: dict[str, Ratio], sims: dict[str, dict[str, Ratio]]) -> str:
    """Markdown table of the real rates (with counts) beside each simulated column."""
    head = "| statistic | real (k/n) | real rate | " + " | ".join(sims) + " |"
    sep = "|---|---:|---:|" + "---:|" * len(sims)
    rows = [head, sep]
    for name, r in real.items():
        cells = [f"{s[name].rate:.3f}" if name in s and s[name].den else "–" for s in sims.values()]
        rows.append(f"| {name} | {r.num}/{r.den} | {r.rate:.3f} | " + " | ".join(cells) + " |" if r.den
                    else f"| {name} | 0/0 | – | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def params_table(prior: SimParams, fitted: SimParams) -> str:
    """Markdown table of every SimParams field: prior centre and fitted value."""
    rows = ["| parameter | default (prior centre) | fitted |", "|---|---:|---:|"]
    for f in fields(SimParams):
        a, b = getattr(prior, f.name), getattr(fitted, f.name)
        fmt = (lambda v: "[" + ", ".join(f"{x:.3f}" for x in v) + "]") if f.name == "skills" else (lambda v: f"{v:.3f}")
        rows.append(f"| {f.name} | {fmt(a)} | {fmt(b)} |")
    return "\n".join(rows)


def run_fit(traces: str, out: str, report: str | None, replicates: int, seed: int, command: str) -> dict[str, Any]:
    """Fit the traces, replay fitted and default sims on their schedules, write the params file and report."""
    t0 = time.perf_counter()
    records = read_traces(traces)
    prior = SimParams()
    fitted, info = fit(records, prior)
    real = compute_stats(records)
    schedules = [Schedule.of(r) for r in records]
    sims = {
        "sim-v1 fitted (synthetic)": compute_stats(simulate(SimBackend(fitted, seed=seed), schedules, replicates, seed)),
        "sim-v1 default (synthetic)": compute_stats(simulate(SimBackend(prior, seed=seed), schedules, replicates, seed)),
    }
    table = comparison_table(real, sims)
    fitted.to_json(out, source_traces=str(traces), seed=seed, fit_info=info, command=command)
    n_tr = len(transitions(records))
    text = "\n".join([
        "# Synthetic debater (`sim-v1`) fitted to real debate traces",
        "",
        f"Command: `{command}`  ",
        (f"Traces: `{traces}` — {len(records)} debates, {records[0].n_agents} agents, "
         f"{len(records[0].rounds) - 1} exchange round(s), {n_tr} transitions.  "),
        (f"Sim replay: {replicates} synthetic questions per logged debate schedule (same temperatures, top-p and "
         f"peer masks), backend seed {seed}.  "),
        f"Fit: {json.dumps(info)}  ",
        f"Fitted parameters: `{out}`. Fit + replay took {time.perf_counter() - t0:.1f} s.",
        "",
        "## Rates: real vs synthetic",
        "",
        ("C→I / I→C: fraction of an agent's correct / incorrect answers at round r that are incorrect / correct at "
         "r + 1; `agree=k`: k of the peers it read shared its answer; `read none`: its mask was empty; T: the "
         "temperature of the new turn. Real rates come with their counts; with tens of transitions the real column "
         "is noisy (a 3/28 rate has a 95 % interval of roughly 0.02–0.28)."),
        "",
        table,
        "",
        "## Parameters",
        "",
        params_table(prior, fitted),
        "",
    ])
    if report:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        Path(report).write_text(text, encoding="utf-8")
    print(table)
    print(f"{LOG_PREFIX} fitted sim parameters written to {out}" + (f"; report {report}" if report else ""))
    return {"params": fitted, "real": real, "sims": sims, "info": info}


# ---------------------------------------------------------------- collection with the real model
def collect(n: int, llm: str, out: str, rounds: int, max_tokens: int, seed: int, mask_p: float,
            t_min: float, t_max: float, n_agents: int, task: str = "gsm8k", split: str = "test",
            parallel: int | None = None, chunk: int | None = None) -> str:
    """Run the real model with random masks (each ordered pair read with prob mask_p) and random per-agent
    temperatures in [t_min, t_max] in every exchange round; round 0 uses the engine default (T=0.7, top-p 0.9)."""
    from dear import tasks
    from dear.debate import DebateConfig, DebateEngine, RoundControl
    from dear.llm.registry import make_backend, options_for

    questions = tasks.load(task, split=split, n=n, seed=seed)
    rng = np.random.default_rng(seed)
    cfg = DebateConfig(n_agents=n_agents, n_rounds=rounds, max_tokens=max_tokens, seed=seed)
    t0 = time.perf_counter()
    kwargs = options_for(llm, {"n_parallel": parallel}) if parallel else {}
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("", encoding="utf-8")
    chunk = chunk or len(questions)
    n_written = 0
    with make_backend(llm, **kwargs) as backend:
        engine = DebateEngine(backend, cfg)
        # chunks: traces reach the disk as they finish, so a long run that is stopped keeps what it did
        for c0 in range(0, len(questions), chunk):
            debates = engine.start(questions[c0 : c0 + chunk])
            for _round in range(1, rounds + 1):
                controls = []
                for _ in debates:
                    mask = rng.random((n_agents, n_agents)) < mask_p
                    np.fill_diagonal(mask, False)
                    controls.append(RoundControl(mask, rng.uniform(t_min, t_max, n_agents), np.full(n_agents, 0.9)))
                engine.step(debates, controls)
            with out_path.open("a", encoding="utf-8") as f:
                for d in debates:
                    f.write(d.trace.to_json() + "\n")
            n_written += len(debates)
            s = engine.stats
            log.info("%d/%d debates written to %s after %.0f s (%d prompt + %d completion tokens so far)",
                     n_written, len(questions), out, time.perf_counter() - t0, s.prompt_tokens, s.completion_tokens)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", help="debate traces JSONL to fit (with --collect: where to write them)")
    ap.add_argument("--report", default=DEFAULT_REPORT, help="Markdown report (fitted sim vs real)")
    ap.add_argument("--replicates", type=int, default=200, help="synthetic questions per logged debate schedule")
    ap.add_argument("--collect", type=int, metavar="N", help="run the real model on N questions first")
    add_question_args(ap, split="test")
    add_backend_args(ap, llm_note="for --collect", max_tokens=384, parallel_note="for --collect", n_ctx=OMIT)
    add_debate_args(ap, n_rounds=1, n_rounds_note="for --collect", seed_note="also of the fit's simulations")
    ap.add_argument("--mask-p", type=float, default=0.5)
    ap.add_argument("--t-min", type=float, default=0.1)
    ap.add_argument("--t-max", type=float, default=1.2)
    ap.add_argument("--chunk", type=int, help="with --collect: debates per batch (traces are appended per chunk)")
    add_output_args(ap, out_help="fitted SimParams JSON (name must contain 'synthetic')", out=DEFAULT_OUT)
    ap.add_argument("--fit", action="store_true", help="with --collect: fit right after collecting")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per loopback request is noise
    command = command_line(PROG, argv)
    if args.collect is not None:
        if args.collect < 1:
            ap.error("--collect N needs N >= 1")
        traces = args.traces or f"results/sim_fit/traces_real_{args.llm.replace(':', '_').replace('/', '_')}.jsonl"
        collect(args.collect, args.llm, traces, args.n_rounds, args.max_tokens, args.seed, args.mask_p,
                args.t_min, args.t_max, args.n_agents, args.task, args.split, args.parallel,
                args.chunk)
        if not args.fit:
            return 0
        args.traces = traces
    if not args.traces:
        ap.error("give --traces TRACES.jsonl (or --collect N)")
    if args.replicates < 1:
        ap.error("--replicates must be >= 1")
    run_fit(args.traces, args.out, args.report, args.replicates, args.seed, command)
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
