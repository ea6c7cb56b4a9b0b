"""Refit the simulated world's independent samples (round 0 and fresh samples) to a bank of the model's real samples,
and validate it out of sample (issue 55, item 7).

    python -m simworld.bank_fit --base worlds/gsm8k-fitted/sim_params_synthetic_texts.json \
        --fresh results/fresh-samples-gsm8k --out worlds/gsm8k-bank-fit

What the sim draws for every independent sample (the `dear.sim` docstring): right with P = σ(s − d − τ·x), d = c +
k·logit(δ), δ ~ U(0, 1) per question, x = T − T0 (+ the top-p term); a wrong draw is idiosyncratic with probability u,
else distractor i with probability ∝ exp(−λ·i); a body of about words_base + words_per_temp·T tokens (sd words_sd);
a confidence as in dear/sim/confidence.py. Refitted here, on the **train/fit** questions (`dear.tasks.held_out`
false) of every train shelf the bank holds for `--benchmark`, `--profile`, top-p and token limit, never a test
question:
- **one skill for identical agents**: s = 0 for every slot. Copies of one model differ in nothing but their draws,
  and with one skill only s − c is identified, so c carries it (the base world's per-slot skills are dropped);
- **the difficulty distribution** (c, k) and, when the shelves hold two or more temperatures, **the effect of T**
  (τ): jointly, by maximum likelihood of each question's right / wrong samples at every temperature, δ integrated on
  the sim's grid (`dear.sim.likelihood.DELTA`). With one temperature τ stays the base world's, and the report says so;
- **collisions of wrong answers** (u, λ, and the trap share π and pull ρ): maximum likelihood of how each
  question's wrong answers coincide (`simworld.mle.fit_wrong_signatures`; real questions either gather their wrong
  answers on one popular mistake or scatter them, which one u and λ for every question cannot draw);
- **completion length** (words_base, words_per_temp, words_sd): least squares of completion tokens on T (with one
  temperature the base world's slope stays, and the base and spread are the shelf's);
- **confidence**: `simworld.confidence_fit` on the T0 shelf.
Everything else (the exchange rounds' dynamics, the token counters, the text recombination) is the base world's.

Validated out of sample on the **train/holdout** questions of the T0 shelf and on `--fresh` (a
`simworld.fresh_samples` directory: GSM8K train questions outside the bank), both read at `--width` samples; the
refit world and the base world each draw `--sim-questions` synthetic questions at the same width and sampling
(SYNTHETIC, labelled so in every column). Compared: the held-out log-likelihood of each real question's right /
wrong pattern under each world's parameters (exact, no simulation), the distribution of right samples per question
(total variation distance), one sample's accuracy by slot, how often the first 3 agree, how often two wrong samples
share an answer, completion tokens, the sampling rules' accuracy (Wilson 95 % intervals on the real side), and the
value of more samples by how the first 3 agree.

Writes OUT/bank_fit.json, OUT/README.md and OUT/sim_params_synthetic_texts.json (the base world with the refit
parameters; train or serve in it with `llm.options.params_file`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize

from dear import tasks
from dear.atomic import atomic_write_text, write_json
from dear.bank.backend import DEFAULT_BANK
from dear.bank.replay import samples_of as bank_samples_of
from dear.bank.store import Bank, BankSample, ShelfKey, shown_path
from dear.cli import command_line, require_at_least
from dear.cli import run as run_cli
from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.protocols import MajorityProtocol
from dear.debate.sampling_rules import AGREEMENT_STATES, RULE_SUMMARY, Samples
from dear.debate.trace import DebateTrace
from dear.sim.backend import SimBackend
from dear.sim.likelihood import DELTA, logmeanexp
from dear.sim.model import difficulty_logit, excess, kappa_of, sigmoid, trap_probability, wrong_label_probs
from dear.sim.params import SimParams
from dear.sim.text import TEXT_OVERHEAD_TOKENS
from dear.tasks import held_out
from simworld import confidence_fit
from simworld.mle import _numeric_hessian, _standard_errors, signature_probs, wrong_signatures
from simworld.corpus import CorpusFile
from simworld.fresh_samples import SAMPLES_FILE
from simworld.sampling_validation import STATE_RULES, by_state, describe, rule_rows

log = logging.getLogger("simworld.bank_fit")
PROG = "python -m simworld.bank_fit"
SIM_SETTINGS = {"top_p": 0.9, "layout": "multiturn"}  # the bank's round-0 sampling besides T and the token limit


@dataclass(frozen=True)
class QuestionDraws:
    """One question's independent samples at one temperature (one shelf)."""

    question_id: str
    temperature: float
    top_p: float
    correct: tuple[bool, ...]
    wrong_answers: tuple[str | None, ...]  # answer keys of the wrong samples (None = no answer)
    completion_tokens: tuple[int, ...]
    cut: tuple[bool, ...]  # finish reason "length": the token limit cut the sample

    @classmethod
    def of(cls, key: ShelfKey, samples: Sequence[BankSample]) -> QuestionDraws:
        return cls(samples[0].question_id, key.temperature, key.top_p, tuple(bool(s.correct) for s in samples),
                   tuple(s.answer_key for s in samples if not s.correct),
                   tuple(int(s.completion_tokens) for s in samples),
                   tuple(s.finish_reason == "length" for s in samples))


def fresh_traces(samples_dir: Path, holdout: bool) -> list[DebateTrace]:
    """The wide round 0s of a `simworld.fresh_samples` directory (GSM8K train questions) on one side of the train
    split."""
    settings = json.loads((samples_dir / "settings.json").read_text(encoding="utf-8"))
    if settings.get("corpus_split") != "train":
        raise ValueError(f"{samples_dir}: its questions are from split {settings.get('corpus_split')!r}, not train")
    return [DebateTrace.from_dict(r["trace"]) for r in CorpusFile(samples_dir / SAMPLES_FILE).records
            if held_out(r["question_id"]) == holdout]


def trace_draws(trace: DebateTrace) -> QuestionDraws:
    """A trace's round 0 as one question's draws (its turns share one temperature and top-p)."""
    turns = trace.rounds[0]
    return QuestionDraws(trace.question_id, float(turns[0].temperature), float(turns[0].top_p),
                         tuple(bool(t.correct) for t in turns), tuple(t.answer_key for t in turns if not t.correct),
                         tuple(int(t.completion_tokens) for t in turns),
                         tuple(t.finish_reason == "length" for t in turns))


def train_shelves(bank: Bank, benchmark: str, profile: str, top_p: float, max_tokens: int) -> list[ShelfKey]:
    """The bank's train shelves of one benchmark, profile, top-p and token limit (one per temperature)."""
    keys = [k for k in bank.keys if (k.benchmark, k.split, k.profile, k.top_p, k.max_tokens)
            == (benchmark, "train", profile, top_p, max_tokens)]
    return sorted(keys, key=lambda k: k.temperature)


def question_draws(bank: Bank, keys: Sequence[ShelfKey], holdout: bool) -> list[QuestionDraws]:
    """Every question of the shelves on one side of the train split (`holdout`: train/holdout, else train/fit)."""
    out = []
    for key in keys:
        shelf = bank.shelf(key)
        out += [QuestionDraws.of(key, shelf.of(q)) for q in shelf.questions if held_out(q) == holdout and shelf.of(q)]
    return out


# ---------------------------------------------------------------- round 0: difficulty, one skill, T, wrong answers
def correctness_grid(params: SimParams, draws: Sequence[QuestionDraws]) -> dict[str, np.ndarray]:
    """Per question: the log-likelihood of its right / wrong samples at every temperature under `params` (sample j
    in slot j, skill `params.skill(j)`) at each point of the difficulty grid (G,)."""
    d = difficulty_logit(params, DELTA)  # (G,)
    grid: dict[str, np.ndarray] = {}
    for q in draws:
        skills = np.array([params.skill(j) for j in range(len(q.correct))])
        pc = np.clip(sigmoid(skills[:, None] - d[None, :] - params.temp_penalty
                             * float(excess(params, q.temperature, q.top_p))), 1e-12, 1 - 1e-12)  # (n, G)
        c = np.array(q.correct)[:, None]
        grid[q.question_id] = grid.get(q.question_id, 0.0) + np.where(c, np.log(pc), np.log1p(-pc)).sum(0)
    return grid


def question_loglik(params: SimParams, draws: Sequence[QuestionDraws]) -> dict[str, float]:
    """Per question: the log-likelihood of which samples are right, δ integrated out."""
    return {qid: float(logmeanexp(ll[None, :])[0]) for qid, ll in correctness_grid(params, draws).items()}


def joint_loglik(params: SimParams, draws: Sequence[QuestionDraws]) -> dict[str, float]:
    """Per question: the log-likelihood of which samples are right and of how its wrong answers coincide, δ and
    whether the question is a trap integrated out (a trap's chance depends on δ: `trap_probability`)."""
    d = difficulty_logit(params, DELTA)
    trap = trap_probability(params, d)  # (G,)
    plain, trapped = wrong_label_probs(params), wrong_label_probs(params, trap=True)
    cache: dict[tuple[bool, int], dict[tuple[int, ...], float]] = {}

    def sig_prob(is_trap: bool, sig: tuple[int, ...]) -> float:
        m = sum(sig)
        if (is_trap, m) not in cache:
            cache[is_trap, m] = signature_probs(trapped if is_trap else plain, m)
        return max(cache[is_trap, m].get(sig, 0.0), 1e-300)

    log_plain: dict[str, float] = {}
    log_trap: dict[str, float] = {}
    for q in draws:
        for sig in wrong_signatures([q.wrong_answers]):
            log_plain[q.question_id] = log_plain.get(q.question_id, 0.0) + math.log(sig_prob(False, sig))
            log_trap[q.question_id] = log_trap.get(q.question_id, 0.0) + math.log(sig_prob(True, sig))
    out = {}
    for qid, ll in correctness_grid(params, draws).items():
        lp, lt = log_plain.get(qid, 0.0), log_trap.get(qid, 0.0)
        top = max(lp, lt)
        wrong = top + np.log((1 - trap) * math.exp(lp - top) + trap * math.exp(lt - top))
        out[qid] = float(logmeanexp((ll + wrong)[None, :])[0])
    return out


@dataclass(frozen=True)
class Round0Fit:
    estimates: dict[str, float]  # on the optimisation scale
    se: dict[str, float | None]
    at_bound: list[str]
    temp_penalty_fitted: bool  # False: one temperature on the shelves, τ is the base world's
    loglik: float
    questions: int
    samples: int


_ROUND0 = (  # name on the optimisation scale, bounds, start, (SimParams field, to the field's scale)
    ("difficulty_center", (-12.0, 12.0), 0.0, ("difficulty_center", float)),
    ("log_difficulty_scale", (-3.0, 3.0), 0.5, ("difficulty_scale", math.exp)),
    ("logit_u", (-12.0, 12.0), -2.0, ("p_unique_wrong", lambda x: float(sigmoid(x)))),
    ("log_lambda", (-4.0, 3.5), 0.4, ("distractor_decay", math.exp)),
    ("logit_trap_share", (-8.0, 8.0), -1.5, ("trap_share", lambda x: float(sigmoid(x)))),
    ("trap_slope", (-5.0, 5.0), 0.0, ("trap_slope", float)),
    ("logit_trap_pull", (-8.0, 8.0), 0.0, ("trap_pull", lambda x: float(sigmoid(x)))),
)
_TAU = ("temp_penalty", (-10.0, 10.0), 0.5, ("temp_penalty", float))


def fit_round0(draws: Sequence[QuestionDraws], base: SimParams) -> tuple[SimParams, Round0Fit]:
    """Difficulty (c, k), τ with two or more temperatures, and the wrong answers' law (u, λ, π, γ, ρ), jointly by
    maximum likelihood, one skill s = 0 (module docstring)."""
    layout = list(_ROUND0) + ([_TAU] if len({q.temperature for q in draws}) >= 2 else [])
    one_skill = replace(base, skills=[0.0])

    def params_of(th: np.ndarray) -> SimParams:
        return replace(one_skill, **{field: to(float(x)) for (_, _, _, (field, to)), x in zip(layout, th)})

    def nll(th: np.ndarray) -> float:
        return -sum(joint_loglik(params_of(th), draws).values())

    bounds = [b for _, b, _, _ in layout]
    res = minimize(nll, np.array([s for _, _, s, _ in layout]), method="L-BFGS-B", bounds=bounds)
    names = [n for n, _, _, _ in layout]
    se = _standard_errors(_numeric_hessian(nll, res.x), names)
    at_bound = [n for n, x, (lo, hi) in zip(names, res.x, bounds) if min(x - lo, hi - x) < 1e-3]
    fit = Round0Fit(dict(zip(names, map(float, res.x))), se, at_bound, _TAU in layout, float(-res.fun),
                    len({q.question_id for q in draws}), sum(len(q.correct) for q in draws))
    return params_of(res.x), fit


# ---------------------------------------------------------------- length
def fit_length(draws: Sequence[QuestionDraws], base: SimParams) -> dict[str, Any]:
    """words_base, words_per_temp, words_sd from the samples the token limit did not cut (the sim's body length is
    completion tokens − TEXT_OVERHEAD_TOKENS). One temperature: the base world's slope, the shelf's mean and spread."""
    rows = [(q.temperature, n) for q in draws for n, cut in zip(q.completion_tokens, q.cut) if not cut]
    if len(rows) < 3:
        raise ValueError(f"too few uncut samples to fit the length ({len(rows)})")
    T = np.array([t for t, _ in rows])
    y = np.array([n for _, n in rows], dtype=float) - TEXT_OVERHEAD_TOKENS
    if float(np.ptp(T)) > 1e-6:
        slope, intercept = np.polyfit(T, y, 1)
        slope = max(float(slope), 0.0)  # the sim needs a non-negative slope (simworld.mle.fit_words)
        fitted_slope = True
    else:
        slope, fitted_slope = base.words_per_temp, False
    intercept = float(np.mean(y - slope * T))
    return {"words_base": intercept, "words_per_temp": float(slope), "words_sd": float(np.std(y - slope * T, ddof=1)),
            "slope_fitted": fitted_slope, "n": len(rows)}


# ---------------------------------------------------------------- the whole fit
@dataclass(frozen=True)
class BankFit:
    params: SimParams
    round0: Round0Fit
    length: dict[str, Any]
    confidence: dict[str, float] | None
    shelves: list[str]


def fit(bank: Bank, keys: Sequence[ShelfKey], base: SimParams, extra: Sequence[QuestionDraws] = ()) -> BankFit:
    """The refit world: the base world with every independent-sample parameter fitted on the shelves' train/fit
    questions and `extra` (more train/fit draws at the same sampling; confidence from the shelves alone)."""
    draws = question_draws(bank, keys, holdout=False) + list(extra)
    if not draws:
        raise ValueError(f"{bank.root}: the shelves {[k.name for k in keys]} hold no train/fit question")
    p, round0 = fit_round0(draws, base)
    length = fit_length(draws, base)
    p = replace(p, words_base=length["words_base"], words_per_temp=length["words_per_temp"],
                words_sd=length["words_sd"])
    conf = None
    t0 = [k for k in keys if k.temperature == base.t_ref]
    if t0:
        every = confidence_fit.samples_of(bank, t0[0])
        fit_part = [s for s in every if not held_out(s.question_id)]
        if fit_part:
            conf = confidence_fit.fit(fit_part)
            p = replace(p, **conf)
    return BankFit(SimParams.from_dict(p.to_dict()), round0, length, conf, [k.name for k in keys])


# ---------------------------------------------------------------- validation
def sim_samples(params: SimParams, n: int, width: int, temperature: float, max_tokens: int, seed: int
                ) -> list[Samples]:
    """A `width`-wide round 0 on n synthetic questions of the world `params` (SYNTHETIC)."""
    backend = SimBackend(params, seed=seed)
    questions = tasks.load("synthetic", split="train", n=n, seed=seed)
    engine = DebateEngine(backend, DebateConfig(n_agents=width, n_rounds=0, temperature0=temperature,
                                                top_p0=SIM_SETTINGS["top_p"], max_tokens=max_tokens, seed=seed,
                                                layout=SIM_SETTINGS["layout"]))
    return [Samples.of(d.trace) for d in engine.run(questions, MajorityProtocol())]


def as_draws(samples: Sequence[Samples], temperature: float, top_p: float) -> list[QuestionDraws]:
    """Samples (one per question) as QuestionDraws for the likelihood (lengths left empty)."""
    return [QuestionDraws(f"q{i}", temperature, top_p, s.correct,
                          tuple(k for k, c in zip(s.keys, s.correct) if not c), (), ())
            for i, s in enumerate(samples)]


def total_variation(a: Sequence[int], b: Sequence[int]) -> float:
    """½·Σ|p − q| between two count histograms of equal length."""
    p, q = np.array(a, float) / max(1, sum(a)), np.array(b, float) / max(1, sum(b))
    return float(0.5 * np.abs(p - q).sum())


def side_summary(samples: Sequence[Samples], width: int) -> dict[str, Any]:
    """One side's shape, rules and per-state value of sampling (simworld.sampling_validation's measures)."""
    cut = [Samples(s.keys[:width], s.correct[:width], s.tokens[:width]) for s in samples]
    shape = describe(cut)
    rules = ["cot", "sc-3", f"sc-{width}", "adaptive-sc-2-from-2", "adaptive-sc-2",
             "adaptive-sc-3"]
    rows = rule_rows(cut, rules)
    states = by_state(cut, [r for r in STATE_RULES if r != "sc-9"] + [f"sc-{width}"])
    return {"questions": len(cut), "shape": shape, "rules": [asdict(r) for r in rows], "by_state": states}


def validate(fitted: SimParams, base: SimParams, held: Sequence[Samples], width: int, temperature: float,
             max_tokens: int, sim_questions: int, seed: int, completion: Sequence[int]) -> dict[str, Any]:
    held = [s for s in held if len(s.keys) >= width]
    draws = as_draws([Samples(s.keys[:width], s.correct[:width], s.tokens[:width]) for s in held], temperature,
                     SIM_SETTINGS["top_p"])
    out: dict[str, Any] = {"width": width, "real_questions": len(held),
                           "real": side_summary(held, width),
                           "real_completion_tokens": [float(np.mean(completion)), float(np.std(completion, ddof=1))]}
    for name, p in (("refit", fitted), ("base", base)):
        ll = joint_loglik(p, draws)
        sim = sim_samples(p, sim_questions, width, temperature, max_tokens, seed)
        summary = side_summary(sim, width)
        out[name] = {"heldout_loglik_per_question": float(np.mean(list(ll.values()))), "sim_synthetic": summary,
                     "correct_per_question_tv": total_variation(out["real"]["shape"]["correct_per_question"],
                                                                summary["shape"]["correct_per_question"])}
    return out


# ---------------------------------------------------------------- report
def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _outside(sim_row: dict[str, Any], real_row: dict[str, Any]) -> str:
    return "" if real_row["ci_low"] <= sim_row["accuracy"] <= real_row["ci_high"] else " (outside)"


def readme(doc: dict[str, Any]) -> str:
    f, v = doc["fit"], doc["validation"]
    r0, length = f["round0"], f["length"]
    real, refit, base = v["real"], v["refit"], v["base"]
    rs, fs, bs = real["shape"], refit["sim_synthetic"]["shape"], base["sim_synthetic"]["shape"]
    width = v["width"]
    new, old = doc["params"], doc["base_params"]
    se = {k: ("–" if s is None else f"{s:.2f}") for k, s in r0["se"].items()}
    tau_how = ("ML, jointly, over the shelves' temperatures" if r0["temp_penalty_fitted"] else
               "the base world's: the bank holds one temperature (the T grid of issue 55 item 2 refits it)")
    lines = [
        "# The simulated world's independent samples, refitted to the bank",
        "",
        f"Command: `{doc['command']}` (simulation seed {doc['seed']}). Bank `{doc['bank']}`, model "
        f"`{doc['model_file']}`; fitted on {doc['fit_sources']} ({r0['questions']} questions, {r0['samples']} "
        f"samples); base world `{doc['base']}`. No test question is read.",
        "",
        "Round 0 and the wrong answers are one joint maximum-likelihood fit (difficulty δ and whether a question is a "
        "trap integrated out); ± is the standard error on the optimisation scale (logit / log where named); "
        f"at a bound: {', '.join(r0['at_bound']) or 'none'}.",
        "",
        "| parameter | refit | base world | how |",
        "|---|---:|---:|---|",
        f"| skills | [0] | [{', '.join(f'{x:.2f}' for x in old['skills'])}] | one skill for copies of one model "
        "(only s − c is identified) |",
        f"| difficulty centre c | {new['difficulty_center']:.3f} (± {se['difficulty_center']}) | "
        f"{old['difficulty_center']:.3f} | joint ML |",
        f"| difficulty scale k | {new['difficulty_scale']:.3f} (log ± {se['log_difficulty_scale']}) | "
        f"{old['difficulty_scale']:.3f} | joint ML |",
        f"| temperature penalty τ | {new['temp_penalty']:.3f}"
        f"{f' (± {se[_TAU[0]]})' if r0['temp_penalty_fitted'] else ''} | {old['temp_penalty']:.3f} | {tau_how} |",
        f"| idiosyncratic wrong u | {new['p_unique_wrong']:.3f} (logit ± {se['logit_u']}) | "
        f"{old['p_unique_wrong']:.3f} | joint ML |",
        f"| distractor decay λ | {new['distractor_decay']:.3f} (log ± {se['log_lambda']}) | "
        f"{old['distractor_decay']:.3f} | joint ML |",
        f"| trap share π (at d = c) | {new['trap_share']:.3f} (logit ± {se['logit_trap_share']}) | "
        f"{old['trap_share']:.3f} | joint ML |",
        f"| trap slope γ (per unit of difficulty logit) | {new['trap_slope']:.3f} (± {se['trap_slope']}) | "
        f"{old['trap_slope']:.3f} | joint ML |",
        f"| trap pull ρ | {new['trap_pull']:.3f} (logit ± {se['logit_trap_pull']}) | {old['trap_pull']:.3f} | "
        f"joint ML; κ = P(two wrong agree), over questions: {doc['kappa']['refit']:.3f} (base "
        f"{doc['kappa']['base']:.3f}) |",
        f"| length base / per T / sd | {length['words_base']:.0f} / {length['words_per_temp']:.0f} / "
        f"{length['words_sd']:.0f} | {old['words_base']:.0f} / {old['words_per_temp']:.0f} / {old['words_sd']:.0f} | "
        "least squares on "
        f"{length['n']} uncut samples{'' if length['slope_fitted'] else ' (slope: the base world’s, one temperature)'} |",
        "| confidence | " + ("fitted (simworld.confidence_fit's model)" if f["confidence"] else "none") + " | "
        + ("fitted" if old["confidence_sd_correct"] > 0 else "none") + " | moments on train/fit |",
        "",
        f"## Out of sample: {v['real_questions']} real GSM8K train questions no fit read, {width} samples each",
        "",
        f"Real: {doc['holdout_sources']}. Each simulated side draws {refit['sim_synthetic']['questions']} synthetic "
        "questions (SYNTHETIC). Accuracy in % (ties as expected values); the real side with Wilson 95 % intervals "
        "over questions.",
        "",
        "| measure | real | refit world (synthetic) | base world (synthetic) |",
        "|---|---|---|---|",
        f"| held-out log-likelihood per question of its right/wrong pattern and wrong-answer groups (exact, higher "
        f"is better) | – | {refit['heldout_loglik_per_question']:.3f} "
        f"| {base['heldout_loglik_per_question']:.3f} |",
        f"| right samples per question: total variation to real | – | {refit['correct_per_question_tv']:.3f} | "
        f"{base['correct_per_question_tv']:.3f} |",
        f"| one sample's accuracy | {_pct(rs['sample_accuracy'])} | {_pct(fs['sample_accuracy'])} | "
        f"{_pct(bs['sample_accuracy'])} |",
        "| by slot (sample k in slot k mod 3) | " + " / ".join(_pct(a) for a in rs["accuracy_by_slot"]) + " | "
        + " / ".join(_pct(a) for a in fs["accuracy_by_slot"]) + " | " + " / ".join(_pct(a) for a in bs["accuracy_by_slot"])
        + " |",
        f"| first 3 unanimous | {_pct(rs['first3_unanimous'])} | {_pct(fs['first3_unanimous'])} | "
        f"{_pct(bs['first3_unanimous'])} |",
        f"| two wrong samples share an answer | {_pct(rs['wrong_pairs_same_answer'])} ({rs['wrong_pairs']} pairs) | "
        f"{_pct(fs['wrong_pairs_same_answer'])} | {_pct(bs['wrong_pairs_same_answer'])} |",
        f"| completion tokens / sample, mean (sd) | {v['real_completion_tokens'][0]:.0f} "
        f"({v['real_completion_tokens'][1]:.0f}) | {doc['sim_completion_tokens']['refit'][0]:.0f} "
        f"({doc['sim_completion_tokens']['refit'][1]:.0f}) | {doc['sim_completion_tokens']['base'][0]:.0f} "
        f"({doc['sim_completion_tokens']['base'][1]:.0f}) |",
    ]
    for r, fr, br in zip(real["rules"], refit["sim_synthetic"]["rules"], base["sim_synthetic"]["rules"]):
        lines.append(f"| {r['rule']}: accuracy, samples | {_pct(r['accuracy'])} [{_pct(r['ci_low'])}, "
                     f"{_pct(r['ci_high'])}], {r['samples']:.2f} | {_pct(fr['accuracy'])}{_outside(fr, r)}, "
                     f"{fr['samples']:.2f} | {_pct(br['accuracy'])}{_outside(br, r)}, {br['samples']:.2f} |")
    lines += [
        "",
        f"Right samples per question, share of questions (0 … {width}):",
        "",
        "| side | " + " | ".join(str(k) for k in range(width + 1)) + " |",
        "|---|" + "---:|" * (width + 1),
    ]
    for side, shape in (("real", rs), ("refit world (synthetic)", fs), ("base world (synthetic)", bs)):
        n = max(1, sum(shape["correct_per_question"]))
        lines.append(f"| {side} | " + " | ".join(f"{100 * c / n:.0f}" for c in shape["correct_per_question"]) + " |")
    last = f"sc-{width}"
    lines += [
        "",
        f"The value of more samples by how the first 3 agree: share of questions, sc-3 and {last} accuracy, and the "
        f"gain {last} − sc-3 (the fitted world of issue 39 priced it at half its real worth after three different "
        "answers).",
        "",
        f"| first 3 | side | questions | sc-3 | {last} | gain |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for state in AGREEMENT_STATES:
        for side, table in (("real", real["by_state"]), ("refit (synthetic)", refit["sim_synthetic"]["by_state"]),
                            ("base (synthetic)", base["sim_synthetic"]["by_state"])):
            row = table[state]
            acc = row["accuracy"]
            lines.append(f"| {state} | {side} | {row['questions']} ({100 * row['share']:.0f} %) | "
                         f"{_pct(acc['sc-3'])} | {_pct(acc[last])} | {100 * (acc[last] - acc['sc-3']):+.1f} |")
    lines += ["", doc["reading"], "",
              "Use (SYNTHETIC: every output of this world is labelled so): train in it with the fitted world's config "
              f"and this parameter file, `python -m train.happo --config sim llm.options.params_file={doc['out']}/"
              "sim_params_synthetic_texts.json` (the text bank stays the config's). The bank world replays the same "
              "samples exactly; this world is for what a bank cannot hold (mixed pools, wide pools, other sampling).",
              ""]
    return "\n".join(lines)


def reading(doc: dict[str, Any]) -> str:
    """What the validation says, from its numbers (no hand-written verdicts)."""
    v = doc["validation"]
    better_ll = v["refit"]["heldout_loglik_per_question"] > v["base"]["heldout_loglik_per_question"]
    better_tv = v["refit"]["correct_per_question_tv"] < v["base"]["correct_per_question_tv"]
    outside = [r["rule"] for r, s in zip(v["real"]["rules"], v["refit"]["sim_synthetic"]["rules"])
               if not r["ci_low"] <= s["accuracy"] <= r["ci_high"]]
    return (f"Reading: on held-out questions the refit world is {'more' if better_ll else 'less'} likely than the "
            f"base world and its right-per-question distribution is {'closer to' if better_tv else 'further from'} "
            f"the real one; the refit world's rule accuracies fall "
            + ("inside every real interval." if not outside else f"outside the real interval for {', '.join(outside)}.")
            + f" {v['real_questions']} held-out questions give wide intervals; the same command re-reads the bank as "
            "its train shelf grows.")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bank", type=Path, default=Path(DEFAULT_BANK), help="bank directory (default: the committed one)")
    p.add_argument("--benchmark", default="gsm8k")
    p.add_argument("--profile", default="cot")
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--base", type=Path, required=True, help="the sim parameter file of the world to refit")
    p.add_argument("--fresh", type=Path, default=None,
                   help="a simworld.fresh_samples directory: more held-out train questions outside the bank")
    p.add_argument("--width", type=int, default=8, help="samples per question compared (default %(default)s)")
    p.add_argument("--sim-questions", type=int, default=2000, help="simulated questions per world (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="output directory (the refit world's folder)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    require_at_least(a, 2, "width")
    require_at_least(a, 1, "sim_questions")
    bank = Bank.open(a.bank)
    keys = train_shelves(bank, a.benchmark, a.profile, a.top_p, a.max_tokens)
    if not keys:
        raise ValueError(f"{a.bank}: no train shelf of {a.benchmark}/{a.profile} at top-p {a.top_p:g}, "
                         f"{a.max_tokens} tokens; build one with python -m dear.bank build --split train")
    base = SimParams.from_json(a.base)
    extra = [trace_draws(t) for t in fresh_traces(a.fresh, holdout=False)] if a.fresh else []
    result = fit(bank, keys, base, extra)
    fit_sources = "the train/fit questions of " + ", ".join(f"`{k.name}`" for k in keys)
    if a.fresh:
        fit_sources += f" and the {len(extra)} train/fit questions of `{shown_path(a.fresh)}` (no confidence)"
    t0 = [k for k in keys if k.temperature == base.t_ref]
    if not t0:
        raise ValueError(f"no train shelf at the reference temperature {base.t_ref:g} to validate on")
    shelf = bank.shelf(t0[0])
    held_ids = [q for q in shelf.questions if held_out(q)]
    held = [bank_samples_of(shelf.of(q), RULE_SUMMARY) for q in held_ids]
    completion = [s.completion_tokens for q in held_ids for s in shelf.of(q)]
    sources = f"{len(held_ids)} train/holdout questions of `{t0[0].name}`"
    if a.fresh is not None:
        fresh = fresh_traces(a.fresh, holdout=True)
        held += [Samples.of(t) for t in fresh]
        completion += [t.completion_tokens for trace in fresh for t in trace.rounds[0]]
        sources += f" and the {len(fresh)} train/holdout questions of `{shown_path(a.fresh)}`"
    validation = validate(result.params, base, held, a.width, base.t_ref, a.max_tokens, a.sim_questions, a.seed,
                          completion)
    sim_tokens = {}
    for name, p in (("refit", result.params), ("base", base)):
        comp = sim_samples_completion(p, a.max_tokens, a.seed)
        sim_tokens[name] = [float(np.mean(comp)), float(np.std(comp, ddof=1))]
    doc = {"command": command_line(PROG, argv), "seed": a.seed, "bank": shown_path(a.bank),
           "model_file": bank.manifest.get("model_file", ""), "base": shown_path(a.base),
           "base_params": base.to_dict(), "params": result.params.to_dict(),
           "fit": {"shelves": result.shelves, "round0": asdict(result.round0), "length": result.length,
                   "confidence": result.confidence},
           "out": shown_path(a.out), "fit_sources": fit_sources, "holdout_sources": sources, "validation": validation, "sim_completion_tokens": sim_tokens,
           "kappa": {"refit": kappa_of(result.params), "base": kappa_of(base)}}
    doc["reading"] = reading(doc)
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "bank_fit.json", doc, indent=2, trailing_newline=True)
    result.params.to_json(a.out / "sim_params_synthetic_texts.json", base=shown_path(a.base),
                          bank_fit=shown_path(a.out / "bank_fit.json"))
    text = readme(doc)
    atomic_write_text(a.out / "README.md", text)
    print(text)
    return 0


def sim_samples_completion(params: SimParams, max_tokens: int, seed: int, n: int = 400) -> list[int]:
    """Completion tokens of n simulated samples at T0 (SYNTHETIC), read from the sim backend's completions."""
    backend = SimBackend(params, seed=seed)
    questions = tasks.load("synthetic", split="train", n=n, seed=seed)
    engine = DebateEngine(backend, DebateConfig(n_agents=1, n_rounds=0, temperature0=params.t_ref,
                                                top_p0=SIM_SETTINGS["top_p"], max_tokens=max_tokens, seed=seed,
                                                layout=SIM_SETTINGS["layout"]))
    return [d.trace.rounds[0][0].completion_tokens for d in engine.run(questions, MajorityProtocol())]


if __name__ == "__main__":
    run_cli(main, PROG)
