"""Fit the synthetic debater model (`sim`, dear/llm/sim.py) to logged real debates, and collect such logs.

    # fit SimParams to debate traces (JSONL of DebateTrace.to_dict()), compare fitted sim vs real
    python -m eval.fit_sim --traces results/sim_fit/traces_real_local.jsonl \\
        [--out results/sim_fit/params_synthetic_fit.json] [--report results/sim_fit/fit_report.md]

    # run the real model on N GSM8K test questions with random masks and temperatures, write the traces
    python -m eval.fit_sim --collect 16 --llm local [--n-rounds 1] [--max-tokens 384] [--seed 0] [--fit]

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
For a corpus (issue 14) use `fit_mle` instead (via `python -m eval.fit_corpus`): joint maximum likelihood of
every parameter with no priors, an identification report, and out-of-sample validation.
The fitted sim is then replayed on the same schedules (same per-agent temperatures, top-p and peer masks,
`--replicates` synthetic questions per logged debate) and its rates are printed beside the real ones.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import re
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize

from dear.cli import run as run_cli
from dear.deprecation import add_renamed_flags
from dear.llm.base import ChatMessage, ChatRequest
from dear.metrics import Ratio
from dear.llm.sim import (
    LOG_PREFIX,
    TEXT_OVERHEAD_TOKENS,
    SimBackend,
    SimParams,
    difficulty_logit,
    distractor_weights,
    excess,
    p_correct,
    p_move,
    sigmoid,
)
from dear.tasks.synthetic import load_synthetic
from dear.vote import tally

log = logging.getLogger("eval.fit_sim")

DEFAULT_OUT = "results/sim_fit/params_synthetic_fit.json"
DEFAULT_REPORT = "results/sim_fit/fit_report.md"
TEMP_BINS = ((0.0, 0.5), (0.5, 0.9), (0.9, 2.01))
_N_GRID = 32  # quadrature points over question difficulty δ ∈ (0, 1)
_DELTA = (np.arange(_N_GRID) + 0.5) / _N_GRID


# ---------------------------------------------------------------- records
@dataclass(frozen=True)
class Turn:
    agent: int
    answer: str | None  # normalised answer key
    correct: bool
    temperature: float
    top_p: float
    peers: tuple[int, ...]  # agents read in this turn's prompt


@dataclass
class DebateRecord:
    question_id: str
    rounds: list[list[Turn]]  # rounds[r][agent]

    @property
    def n_agents(self) -> int:
        return len(self.rounds[0]) if self.rounds else 0


@dataclass(frozen=True)
class Transition:
    """One agent from round r to r + 1."""

    debate: int  # index into the record list
    agent: int
    round: int  # the new round (r + 1)
    own: str | None
    own_correct: bool
    n_read: int  # peers read (with an answer)
    n_agr: int
    n_dis: int
    gold_share: float  # among the plurality of disagreeing peers' answers: fraction that is correct
    temperature: float
    top_p: float
    new: str | None
    new_correct: bool


def _turn_from_dict(d: dict[str, Any], where: str) -> Turn:
    try:
        return Turn(
            agent=int(d["agent"]),
            answer=None if d.get("answer_key") is None else str(d["answer_key"]),
            correct=bool(d["correct"]),
            temperature=float(d["temperature"]),
            top_p=float(d.get("top_p", 0.9)),
            peers=tuple(int(j) for j in d.get("peers") or ()),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: bad agent turn ({type(e).__name__}: {e})") from e


def record_from_dict(d: dict[str, Any], where: str) -> DebateRecord | None:
    """One DebateTrace dict → a record (None for a failed debate: its rounds are incomplete)."""
    if not isinstance(d, dict) or "rounds" not in d:
        raise ValueError(f"{where}: not a DebateTrace (no 'rounds' key)")
    if d.get("failed"):
        log.warning("%s: skipping failed debate %s", where, d.get("debate_id"))
        return None
    rounds = [[_turn_from_dict(t, f"{where} round {r}") for t in turns] for r, turns in enumerate(d["rounds"])]
    for r, turns in enumerate(rounds):
        if [t.agent for t in turns] != list(range(len(turns))):
            raise ValueError(f"{where}: round {r} agents are {[t.agent for t in turns]}, expected 0..V-1")
    if not rounds:
        return None
    return DebateRecord(str(d.get("question_id", where)), rounds)


def read_traces(path: str | Path) -> list[DebateRecord]:
    """DebateTrace JSONL → records. Failed debates (trace.failed) are skipped: their rounds are incomplete."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"traces file not found: {path}")
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e})") from e
            rec = record_from_dict(d, where)
            if rec is not None:
                out.append(rec)
    if not out:
        raise ValueError(f"{path}: no usable debates")
    return out


def transitions(records: Sequence[DebateRecord]) -> list[Transition]:
    out = []
    for k, rec in enumerate(records):
        for r in range(1, len(rec.rounds)):
            prev, cur = rec.rounds[r - 1], rec.rounds[r]
            gold = next((t.answer for t in prev + cur if t.correct and t.answer is not None), None)
            for t in cur:
                own = prev[t.agent]
                read = [prev[j].answer for j in t.peers if prev[j].answer is not None]
                n_agr = sum(a == own.answer for a in read) if own.answer is not None else 0
                # the plurality of the disagreeing peers' answers (dear.vote): the share of its leaders that is right
                dis = tally([a for a in read if a != own.answer])
                share = sum(a == gold for a in dis.leaders) / len(dis.leaders) if dis.leaders else 0.0
                out.append(Transition(
                    debate=k, agent=t.agent, round=r, own=own.answer, own_correct=own.correct,
                    n_read=len(read), n_agr=n_agr, n_dis=len(read) - n_agr, gold_share=share,
                    temperature=t.temperature, top_p=t.top_p, new=t.answer, new_correct=t.correct,
                ))
    return out


# ---------------------------------------------------------------- observed statistics
def _agree_slice(t: Transition) -> str:
    if t.n_read == 0:
        return "read none"
    return f"agree={min(t.n_agr, 2)}{'+' if t.n_agr >= 2 else ''}"


def _temp_slice(t: float) -> str:
    for lo, hi in TEMP_BINS:
        if lo <= t < hi:
            return f"T∈[{lo:.1f},{min(hi, 2.0):.1f})"
    return f"T∈[{TEMP_BINS[-1][0]:.1f},2.0]"


def compute_stats(records: Sequence[DebateRecord]) -> dict[str, Ratio]:
    """Observed rates keyed by a readable name (the rows of the report)."""
    stats: dict[str, Ratio] = {}
    r0 = [t for rec in records for t in rec.rounds[0]]
    stats["round-0 accuracy"] = Ratio(sum(t.correct for t in r0), len(r0))
    unan = [len({t.answer for t in rec.rounds[0]}) == 1 and rec.rounds[0][0].answer is not None for rec in records]
    stats["round-0 unanimous questions"] = Ratio(sum(unan), len(unan))
    trs = transitions(records)
    slices: dict[str, list[Transition]] = {"all": trs}
    for t in trs:
        slices.setdefault(_agree_slice(t), []).append(t)
    for t in trs:
        slices.setdefault(_temp_slice(t.temperature), []).append(t)
    order = ["all", "read none", "agree=0", "agree=1", "agree=2+"] + [_temp_slice(lo) for lo, _ in TEMP_BINS]
    for name in order:
        group = slices.get(name, [])
        c = [t for t in group if t.own_correct]
        w = [t for t in group if not t.own_correct]
        stats[f"C→I {name}"] = Ratio(sum(not t.new_correct for t in c), len(c))
        stats[f"I→C {name}"] = Ratio(sum(t.new_correct for t in w), len(w))
    if records:
        last = [t for rec in records for t in rec.rounds[-1]]
        stats["last-round accuracy"] = Ratio(sum(t.correct for t in last), len(last))
    return stats


# ---------------------------------------------------------------- fitting
def _wrong_pair_agreement(records: Sequence[DebateRecord]) -> Ratio:
    """How often two wrong round-0 answers to the same question are the same answer (no-answer = unique)."""
    k = n = 0
    for rec in records:
        wrong = [t.answer for t in rec.rounds[0] if not t.correct]
        for i in range(len(wrong)):
            for j in range(i + 1, len(wrong)):
                n += 1
                k += wrong[i] is not None and wrong[i] == wrong[j]
    return Ratio(k, n)


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


def _round0_arrays(records: Sequence[DebateRecord]):
    V = max(rec.n_agents for rec in records)
    C = np.zeros((len(records), V))
    X_T = np.full((len(records), V), np.nan)
    X_P = np.full((len(records), V), np.nan)
    present = np.zeros((len(records), V), dtype=bool)
    for q, rec in enumerate(records):
        for t in rec.rounds[0]:
            C[q, t.agent] = t.correct
            X_T[q, t.agent] = t.temperature
            X_P[q, t.agent] = t.top_p
            present[q, t.agent] = True
    return V, C, np.nan_to_num(X_T, nan=0.7), np.nan_to_num(X_P, nan=0.9), present


def _round0_lik_grid(p: SimParams, records, arrays) -> np.ndarray:
    """(Q, G) likelihood of each question's round-0 correctness at each difficulty grid point."""
    V, C, T, P, present = arrays
    skills = np.array([p.skill(a) for a in range(V)])
    d = difficulty_logit(p, _DELTA)  # (G,)
    x = excess(p, T, P)  # (Q, V)
    pc = sigmoid(skills[None, :, None] - d[None, None, :] - p.temp_penalty * x[:, :, None])  # (Q, V, G)
    pc = np.clip(pc, 1e-9, 1 - 1e-9)
    ll = np.where(present[:, :, None], np.where(C[:, :, None] > 0, np.log(pc), np.log1p(-pc)), 0.0).sum(1)
    return ll  # log-likelihood (Q, G)


def fit_round0(records: Sequence[DebateRecord], prior: SimParams) -> tuple[SimParams, dict[str, Any]]:
    arrays = _round0_arrays(records)
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
        ll = _round0_lik_grid(unpack(th), records, arrays)
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


@dataclass(frozen=True)
class OutcomeGrid:
    """Per transition (rows) and difficulty grid point (columns): P(observed outcome), P(new answer correct)."""

    log_prob: np.ndarray  # (N, G)
    p_new_correct: np.ndarray  # (N, G)


@dataclass(frozen=True)
class TransitionArrays:
    """Column arrays (N, 1) of a transition list, built once for repeated likelihood evaluations."""

    agent: np.ndarray
    temperature: np.ndarray
    top_p: np.ndarray
    n_dis: np.ndarray
    n_agr: np.ndarray
    own_none: np.ndarray
    own_c: np.ndarray
    share: np.ndarray
    new_c: np.ndarray
    same: np.ndarray

    @classmethod
    def of(cls, trs: Sequence[Transition]) -> TransitionArrays:
        def col(f, dtype=float):
            return np.array([f(t) for t in trs], dtype=dtype)[:, None]

        return cls(col(lambda t: t.agent, int), col(lambda t: t.temperature), col(lambda t: t.top_p),
                   col(lambda t: t.n_dis), col(lambda t: t.n_agr), col(lambda t: t.own is None, bool),
                   col(lambda t: t.own_correct, bool), col(lambda t: t.gold_share), col(lambda t: t.new_correct, bool),
                   col(lambda t: t.new is not None and t.new == t.own, bool))


def transition_outcomes(p: SimParams, trs: Sequence[Transition] | TransitionArrays, kappa: float) -> OutcomeGrid:
    """The sim's exact one-step law of each transition's outcome (correct / same wrong answer / other wrong
    answer), at every difficulty grid point; `kappa` = P(two wrong draws coincide)."""
    a = trs if isinstance(trs, TransitionArrays) else TransitionArrays.of(trs)
    skills = np.array([p.skill(k) for k in range(int(a.agent.max()) + 1)]) if len(a.agent) else np.zeros(1)
    skill = skills[a.agent]
    d = difficulty_logit(p, _DELTA)[None, :]
    x = excess(p, a.temperature, a.top_p)
    n_dis, n_agr, own_none, own_c, share, new_c, same = a.n_dis, a.n_agr, a.own_none, a.own_c, a.share, a.new_c, a.same
    q = p_correct(p, skill, d, x, resolve=True)  # (N, G)
    m = np.where(own_none, 1.0, p_move(p, n_dis, n_agr, x))
    rho = p.p_resolve
    adopt = np.where((n_dis > 0) & ~own_none, 1 - rho, 0.0)  # P(adopt | move)
    resolve = 1 - adopt
    # own correct: wrong at r+1 iff it moved and (adopted a disagreeing answer, or re-solved wrongly)
    p_c_from_c = 1 - m * (adopt + resolve * (1 - q))
    # own wrong (or none): correct if adopting a correct plurality or re-solving correctly
    p_c_from_w = m * (adopt * share + resolve * q)
    p_same_w = np.where(own_none, 0.0, (1 - m) + m * resolve * (1 - q) * kappa)
    p_other_w = np.clip(1 - p_c_from_w - p_same_w, 1e-9, 1.0)
    prob = np.where(
        own_c,
        np.where(new_c, p_c_from_c, 1 - p_c_from_c),
        np.where(new_c, p_c_from_w, np.where(same, p_same_w, p_other_w)),
    )
    p_new_c = np.where(own_c, p_c_from_c, p_c_from_w)
    return OutcomeGrid(np.log(np.clip(prob, 1e-9, 1.0)), np.broadcast_to(p_new_c, prob.shape))


def _transition_loglik_grid(p: SimParams, trs: Sequence[Transition], kappa: float) -> np.ndarray:
    """(N, G) log-probability of each transition's outcome at each difficulty grid point."""
    return transition_outcomes(p, trs, kappa).log_prob


def fit_transitions(records: Sequence[DebateRecord], base: SimParams, prior: SimParams) -> tuple[SimParams, dict]:
    trs = transitions(records)
    if not trs:
        return base, {"transitions": 0}
    arrays = _round0_arrays(records)
    ll0 = _round0_lik_grid(base, records, arrays)  # (Q, G), fixed: round-0 parameters are already fitted
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
    agreement = _wrong_pair_agreement(records)
    p = fit_distractors(p, agreement)
    info["wrong_pair_agreement"] = [agreement.num, agreement.den]
    p, info2 = fit_transitions(records, p, prior)
    info.update(info2)
    return p, info


# ---------------------------------------------------------------- maximum likelihood, no priors (issue 14)
# Every dynamics parameter is estimated from the data alone. Conventions that are not estimates (any value gives
# the same likelihood after re-parametrisation) are listed in MLE_CONVENTIONS and reported as such.
MLE_CONVENTIONS = {
    "t_ref": "reference temperature T0 of the excess x: shifts into the intercepts (c, a0, s0), not identifiable",
    "top_p_ref": "reference top-p P0 of the excess x: shifts into the intercepts, not identifiable",
    "skills (mean)": "the mean skill is absorbed in the difficulty centre c; skills are reported with mean 0",
}
_BOUND = 12.0  # |logit-scale parameters| (a logistic term beyond ±12 is a probability within 6e-6 of 0 or 1)
N_DISTRACTORS = 3  # shared wrong answers per synthetic question (dear/tasks/synthetic.py)


@dataclass(frozen=True)
class MLEParam:
    name: str
    lo: float
    hi: float


def _mle_layout(V: int, fit_top_p: bool) -> list[MLEParam]:
    names = ["difficulty_center", "log_difficulty_scale", "temp_penalty"] + (["top_p_weight"] if fit_top_p else [])
    names += [f"skill_{a}" for a in range(V - 1)]
    names += ["switch_bias", "switch_disagree", "switch_agree", "switch_temp", "self_revise_bias",
              "self_revise_temp", "logit_p_resolve", "resolve_bonus"]
    bounds = {"log_difficulty_scale": (-3.0, 3.0), "top_p_weight": (-5.0, 5.0)}
    return [MLEParam(n, *bounds.get(n, (-_BOUND, _BOUND))) for n in names]


def _theta_to_params(th: np.ndarray, layout: Sequence[MLEParam], base: SimParams, V: int) -> SimParams:
    v = dict(zip((q.name for q in layout), th.tolist()))
    skills = [v[f"skill_{a}"] for a in range(V - 1)]
    skills.append(-sum(skills))
    return replace(
        base, difficulty_center=v["difficulty_center"], difficulty_scale=math.exp(v["log_difficulty_scale"]),
        temp_penalty=v["temp_penalty"], top_p_weight=v.get("top_p_weight", base.top_p_weight), skills=skills,
        switch_bias=v["switch_bias"], switch_disagree=v["switch_disagree"], switch_agree=v["switch_agree"],
        switch_temp=v["switch_temp"], self_revise_bias=v["self_revise_bias"], self_revise_temp=v["self_revise_temp"],
        p_resolve=float(sigmoid(v["logit_p_resolve"])), resolve_bonus=v["resolve_bonus"],
    )


def _params_to_theta(p: SimParams, layout: Sequence[MLEParam], V: int) -> np.ndarray:
    skills = [p.skill(a) for a in range(V)]
    mean = float(np.mean(skills))
    v = {"difficulty_center": p.difficulty_center - mean, "log_difficulty_scale": math.log(p.difficulty_scale),
         "temp_penalty": p.temp_penalty, "top_p_weight": p.top_p_weight,
         **{f"skill_{a}": skills[a] - mean for a in range(V - 1)},
         "switch_bias": p.switch_bias, "switch_disagree": p.switch_disagree, "switch_agree": p.switch_agree,
         "switch_temp": p.switch_temp, "self_revise_bias": p.self_revise_bias, "self_revise_temp": p.self_revise_temp,
         "logit_p_resolve": float(np.clip(logit_scalar(p.p_resolve), -_BOUND, _BOUND)),
         "resolve_bonus": p.resolve_bonus}
    return np.array([float(np.clip(v[q.name], q.lo, q.hi)) for q in layout])


def logit_scalar(x: float) -> float:
    x = min(max(float(x), 1e-6), 1 - 1e-6)
    return math.log(x / (1 - x))


def kappa_of(p: SimParams) -> float:
    """P(two independent wrong draws give the same answer) = (1 − u)²·Σ w_i²."""
    return (1 - p.p_unique_wrong) ** 2 * float((distractor_weights(p, N_DISTRACTORS) ** 2).sum())


def _logmeanexp(a: np.ndarray) -> np.ndarray:
    m = a.max(1, keepdims=True)
    return m[:, 0] + np.log(np.exp(a - m).mean(1))


@dataclass(frozen=True)
class LikelihoodParts:
    """Per question: log ∫ P(round 0 | δ) dδ and log ∫ P(round 0, transitions | δ) dδ; transitions per question."""

    round0: np.ndarray
    joint: np.ndarray
    n_transitions: np.ndarray

    @property
    def transitions_loglik(self) -> float:
        """log P(all transitions | round 0), the quantity compared out of sample."""
        return float((self.joint - self.round0).sum())


@dataclass(frozen=True)
class FitData:
    """Records with their round-0 and transition arrays precomputed (the likelihood is evaluated many times)."""

    records: Sequence[DebateRecord]
    round0: tuple
    transitions: list[Transition]
    arrays: TransitionArrays
    debate: np.ndarray

    @classmethod
    def of(cls, records: Sequence[DebateRecord]) -> FitData:
        trs = transitions(records)
        return cls(records, _round0_arrays(records), trs, TransitionArrays.of(trs),
                   np.array([t.debate for t in trs], dtype=int))


def likelihood_parts(p: SimParams, data: Sequence[DebateRecord] | FitData,
                     kappa: float | None = None) -> LikelihoodParts:
    data = data if isinstance(data, FitData) else FitData.of(data)
    ll0 = _round0_lik_grid(p, data.records, data.round0)
    per_q = ll0.copy()
    if data.transitions:
        grid = transition_outcomes(p, data.arrays, kappa_of(p) if kappa is None else kappa)
        np.add.at(per_q, data.debate, grid.log_prob)
    counts = np.bincount(data.debate, minlength=len(data.records))
    return LikelihoodParts(_logmeanexp(ll0), _logmeanexp(per_q), counts)


def _wrong_signatures(records: Sequence[DebateRecord]) -> list[tuple[int, ...]]:
    """Per question: the block sizes of its round-0 wrong answers grouped by equal answer (None = its own block)."""
    out = []
    for rec in records:
        wrong = [t.answer for t in rec.rounds[0] if not t.correct]
        if len(wrong) < 2:
            continue
        counts = Counter(a for a in wrong if a is not None)
        out.append(tuple(sorted(list(counts.values()) + [1] * sum(a is None for a in wrong), reverse=True)))
    return out


def _signature_probs(u: float, lam: float, m: int) -> dict[tuple[int, ...], float]:
    """P(block sizes) of m independent wrong draws: unique w.p. u, else distractor i w.p. softmax(−λ·i)."""
    w = np.exp(-lam * np.arange(N_DISTRACTORS))
    probs = np.concatenate([[u], (1 - u) * w / w.sum()])  # label 0 = idiosyncratic
    out: dict[tuple[int, ...], float] = {}
    for labels in itertools.product(range(len(probs)), repeat=m):
        counts = Counter(x for x in labels if x > 0)
        sig = tuple(sorted(list(counts.values()) + [1] * labels.count(0), reverse=True))
        out[sig] = out.get(sig, 0.0) + float(np.prod(probs[list(labels)]))
    return out


def fit_wrong_answers(records: Sequence[DebateRecord], base: SimParams) -> tuple[SimParams, dict[str, Any]]:
    """u (p_unique_wrong) and λ (distractor_decay) by maximum likelihood of how round-0 wrong answers to the same
    question coincide (pairs and triples). Pairs alone identify only κ = (1 − u)²·Σw²; triples separate u and λ."""
    sigs = _wrong_signatures(records)
    agreement = _wrong_pair_agreement(records)
    info: dict[str, Any] = {"wrong_pair_agreement": [agreement.num, agreement.den], "wrong_answer_questions": len(sigs)}
    if not sigs:
        info.update(kappa=None, wrong_answers_identified=False)
        return base, info
    sig_counts = Counter(sigs)

    def nll(th: np.ndarray) -> float:
        u, lam = float(sigmoid(th[0])), float(math.exp(th[1]))
        by_m = {m: _signature_probs(u, lam, m) for m in {sum(sig) for sig in sig_counts}}
        total = 0.0
        for sig, c in sig_counts.items():
            total -= c * math.log(max(by_m[sum(sig)].get(sig, 0.0), 1e-300))
        return total

    res = minimize(nll, np.array([logit_scalar(0.1), math.log(1.5)]), method="L-BFGS-B",
                   bounds=[(-_BOUND, _BOUND), (-4.0, 3.5)])
    u, lam = float(sigmoid(res.x[0])), float(math.exp(res.x[1]))
    p = replace(base, p_unique_wrong=u, distractor_decay=lam)
    H = _numeric_hessian(nll, res.x)
    se = None
    if np.linalg.eigvalsh(H).min() > 1e-8:
        se = np.sqrt(np.diag(np.linalg.inv(H))).tolist()
    at_bound = [abs(res.x[0]) > _BOUND - 1e-3, res.x[1] < -4 + 1e-3 or res.x[1] > 3.5 - 1e-3]
    ok = se is not None and not any(at_bound) and max(se) <= SE_LIMIT
    info.update(kappa=kappa_of(p), logit_u=float(res.x[0]), log_lambda=float(res.x[1]), se=se,
                wrong_answers_identified=bool(ok), questions_with_3_wrong=sum(sum(sig) >= 3 for sig in sigs))
    return p, info


def fit_words(records_turns: Sequence[tuple[float, int, bool]]) -> dict[str, Any]:
    """words_base, words_per_temp: least squares (the Gaussian MLE) of completion tokens on temperature over the
    turns that were not cut at max_tokens; `records_turns` = (temperature, completion tokens, cut)."""
    rows = [(t, n) for t, n, cut in records_turns if not cut]
    if len(rows) < 3 or float(np.ptp([t for t, _ in rows])) < 1e-6:
        return {"identified": False, "n": len(rows)}
    T = np.array([t for t, _ in rows])
    y = np.array([n for _, n in rows], dtype=float) - TEXT_OVERHEAD_TOKENS
    X = np.stack([np.ones_like(T), T], 1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    cov = np.linalg.inv(X.T @ X) * float(resid.var(ddof=2))
    return {"identified": True, "n": len(rows), "words_base": float(coef[0]), "words_per_temp": float(coef[1]),
            "se": [float(math.sqrt(cov[0, 0])), float(math.sqrt(cov[1, 1]))], "resid_sd": float(resid.std(ddof=2))}


def fit_chars_per_token(turns: Sequence[dict]) -> dict[str, float]:
    """The sim's token counters from real turns (ratios of sums, the MLE of a constant rate): prompt characters
    (all messages) per prompt token, and completion characters per completion token."""
    ok = [t for t in turns if t.get("error") is None and t.get("prompt_tokens") and t.get("completion_tokens")]
    if not ok:
        return {"identified": False, "n": 0}
    prompt_chars = sum(len(m["content"]) for t in ok for m in t["messages"])
    text_chars = sum(len(t["text"]) for t in ok)
    return {"identified": True, "n": len(ok),
            "prompt_chars_per_token": prompt_chars / sum(int(t["prompt_tokens"]) for t in ok),
            "text_chars_per_token": text_chars / sum(int(t["completion_tokens"]) for t in ok)}


def _numeric_hessian(f, th: np.ndarray, h: float = 1e-3) -> np.ndarray:
    n = len(th)
    H = np.zeros((n, n))
    f0 = f(th)
    for i in range(n):
        ei = np.zeros(n)
        ei[i] = h
        H[i, i] = (f(th + ei) - 2 * f0 + f(th - ei)) / h**2
        for j in range(i + 1, n):
            ej = np.zeros(n)
            ej[j] = h
            H[i, j] = H[j, i] = (f(th + ei + ej) - f(th + ei - ej) - f(th - ei + ej) + f(th - ei - ej)) / (4 * h * h)
    return H


def _standard_errors(H: np.ndarray, names: Sequence[str]) -> dict[str, float | None]:
    """sqrt(diag(H⁻¹)) per parameter; all None when H is singular or not positive definite."""
    try:
        evals = np.linalg.eigvalsh(H)
        if evals.min() > 1e-8 * max(1.0, evals.max()):
            cov = np.linalg.inv(H)
            return {n: float(math.sqrt(max(cov[k, k], 0.0))) for k, n in enumerate(names)}
    except np.linalg.LinAlgError:
        pass
    return {n: None for n in names}


@dataclass
class MLEFit:
    params: SimParams
    estimates: dict[str, float]  # on the optimisation scale (logs / logits as named)
    se: dict[str, float | None]  # standard errors from the observed information (None: not invertible)
    identified: dict[str, bool]
    why_not: dict[str, str]
    info: dict[str, Any]


SE_LIMIT = 5.0  # an estimate whose standard error exceeds this (on its logit / log scale) is not identified


# The transition law's parameters (on the optimisation scale) that `ridge` shrinks towards 0 = "no effect" / even
# odds. Round 0 (difficulty, skills) is identified by every question and is never penalised.
PENALISED = frozenset({"temp_penalty", "top_p_weight", "switch_bias", "switch_disagree", "switch_agree",
                       "switch_temp", "self_revise_bias", "self_revise_temp", "logit_p_resolve", "resolve_bonus"})


def fit_mle(records: Sequence[DebateRecord], init: SimParams | None = None, ridge: float = 0.0,
            standard_errors: bool = True) -> MLEFit:
    """Joint maximum likelihood of every dynamics parameter (round 0 and transitions, question difficulty
    integrated out per question), no priors. `init` is only the optimiser's start. Identification: a parameter
    is reported not identified when the data do not vary what it multiplies (e.g. top-p constant), when its
    estimate sits at a bound (the likelihood keeps rising towards 0/1 probabilities), or when its standard error
    from the observed information matrix exceeds SE_LIMIT (or the matrix is singular in its direction).

    `ridge` = λ > 0 maximises the penalised likelihood log L − λ/2 · Σ θ² over the PENALISED parameters instead
    (λ = 0 is plain ML): rare flips let plain ML push a logit to its bound, i.e. call an unseen event impossible,
    which costs ~20 nats each time it happens out of sample. Choose λ by cross-validation (eval.fit_corpus), not by
    hand. Standard errors then come from the penalised objective's curvature; `standard_errors=False` skips them
    (the numeric Hessian is a third of a fit's time)."""
    if ridge < 0:
        raise ValueError(f"fit_mle: ridge must be >= 0, got {ridge}")
    if not records:
        raise ValueError("fit_mle: no debates")
    V = max(rec.n_agents for rec in records)
    init = SimParams.from_dict({**(init or SimParams()).to_dict(), "skills": [(init or SimParams()).skill(a)
                                                                             for a in range(V)]})
    p_wrong, wrong_info = fit_wrong_answers(records, init)
    kappa = kappa_of(p_wrong)
    trs = transitions(records)
    top_ps = [t.top_p for rec in records for turns in rec.rounds for t in turns]
    temps_ex = [t.temperature for t in trs]
    fit_top_p = float(np.ptp(top_ps)) > 1e-6
    layout = _mle_layout(V, fit_top_p)
    base = replace(init, p_unique_wrong=p_wrong.p_unique_wrong, distractor_decay=p_wrong.distractor_decay)
    th0 = _params_to_theta(base, layout, V)

    data = FitData.of(records)
    penalised = np.array([q.name in PENALISED for q in layout])

    def nll(th: np.ndarray) -> float:
        penalty = 0.5 * ridge * float((th[penalised] ** 2).sum()) if ridge else 0.0
        return -float(likelihood_parts(_theta_to_params(th, layout, base, V), data, kappa).joint.sum()) + penalty

    res = minimize(nll, th0, method="L-BFGS-B", bounds=[(q.lo, q.hi) for q in layout])
    th = res.x
    names = [q.name for q in layout]
    se: dict[str, float | None] = {n: None for n in names}
    if standard_errors:
        se = _standard_errors(_numeric_hessian(nll, th), names)
    why: dict[str, str] = {}
    for k, q in enumerate(layout):
        if min(th[k] - q.lo, q.hi - th[k]) < 1e-3:
            why[q.name] = f"at the bound {q.lo if th[k] - q.lo < 1e-3 else q.hi} (likelihood rises towards it)"
        elif not standard_errors:
            continue  # no curvature computed: only the bound test applies
        elif se[q.name] is None:
            why[q.name] = "observed information singular in its direction"
        elif se[q.name] > SE_LIMIT:
            why[q.name] = f"standard error {se[q.name]:.1f} > {SE_LIMIT}"
    n_read0 = sum(t.n_read == 0 and t.own is not None for t in trs)
    n_dis = sum(t.n_dis > 0 and t.own is not None for t in trs)
    if n_read0 == 0:
        for n in ("self_revise_bias", "self_revise_temp"):
            why[n] = "no transition with an empty mask"
    if n_dis == 0:
        for n in ("switch_disagree", "logit_p_resolve"):
            why[n] = "no transition reading a disagreeing peer"
    if float(np.ptp(temps_ex)) < 1e-6 if temps_ex else True:
        for n in ("switch_temp", "self_revise_temp"):
            why[n] = "exchange-round temperature never varied"
    if not fit_top_p:
        why["top_p_weight"] = "top-p never varied (kept at the optimiser's start value)"
    if not wrong_info["wrong_answers_identified"]:
        why["p_unique_wrong / distractor_decay"] = (
            f"wrong-answer coincidences do not pin them down ({wrong_info.get('wrong_answer_questions', 0)} questions "
            f"with >= 2 wrong round-0 answers, s.e. {wrong_info.get('se')}); kept at the optimiser's end point")
    identified = {n: n not in why for n in names}
    fitted = _theta_to_params(th, layout, base, V)
    info = {"converged": bool(res.success), "message": str(res.message), "nll": float(res.fun), "ridge": ridge,
            "n_debates": len(records), "n_transitions": len(trs), "kappa": kappa, **wrong_info,
            "conventions": MLE_CONVENTIONS, "not_identified": why}
    return MLEFit(fitted, dict(zip(names, th.tolist())), se, identified, why, info)


# ---------------------------------------------------------------- replay with the sim
_BOXED = re.compile(r"\\boxed\{([^}]*)\}")


@dataclass(frozen=True)
class Schedule:
    """What a logged debate did, per round and agent: sampling and who was read (round 0 reads nobody)."""

    temperature: tuple[tuple[float, ...], ...]  # [round][agent]
    top_p: tuple[tuple[float, ...], ...]
    peers: tuple[tuple[tuple[int, ...], ...], ...]

    @classmethod
    def of(cls, rec: DebateRecord) -> Schedule:
        return cls(
            tuple(tuple(t.temperature for t in turns) for turns in rec.rounds),
            tuple(tuple(t.top_p for t in turns) for turns in rec.rounds),
            tuple(tuple(t.peers for t in turns) for turns in rec.rounds),
        )

    @classmethod
    def mad(cls, n_agents: int = 3, n_rounds: int = 1, temperature: float = 0.7, top_p: float = 0.9) -> Schedule:
        full = tuple(tuple(j for j in range(n_agents) if j != i) for i in range(n_agents))
        none = tuple(() for _ in range(n_agents))
        return cls(
            tuple(tuple([temperature] * n_agents) for _ in range(n_rounds + 1)),
            tuple(tuple([top_p] * n_agents) for _ in range(n_rounds + 1)),
            (none,) + tuple(full for _ in range(n_rounds)),
        )


def simulate(backend: SimBackend, schedules: Sequence[Schedule], replicates: int = 1, seed: int = 0,
             split: str = "test") -> list[DebateRecord]:
    """Run every schedule on `replicates` fresh synthetic questions each, round by round in one batch per round,
    driving the backend with the same metadata the debate engine sends."""
    jobs = [(s, k) for s in schedules for k in range(replicates)]
    questions = load_synthetic(len(jobs), seed=seed, split=split)
    n_rounds = max(len(s.peers) for s in schedules)
    answers: list[list[list[str | None]]] = [[] for _ in jobs]
    records = [DebateRecord(q.id, []) for q in questions]
    for r in range(n_rounds):
        reqs, where = [], []
        for n, ((s, _), q) in enumerate(zip(jobs, questions)):
            if r >= len(s.peers):
                continue
            for a in range(len(s.peers[r])):
                peers = s.peers[r][a]
                meta = {"debate_id": f"synthetic/{q.id}", "question_id": q.id, "agent": a, "round": r,
                        "own_answer": answers[n][r - 1][a] if r else None,
                        "peer_answers": [answers[n][r - 1][j] for j in peers] if r else [],
                        "question_text": q.question}
                reqs.append(ChatRequest((ChatMessage("user", q.question),), temperature=s.temperature[r][a],
                                        top_p=s.top_p[r][a], max_tokens=4096, seed=seed * 1_000_003 + n * 97 + a * 7 + r,
                                        metadata=meta))
                where.append((n, a))
        comps = backend.generate(reqs)
        for n in {n for n, _ in where}:
            answers[n].append([None] * len(jobs[n][0].peers[r]))
            records[n].rounds.append([])
        for (n, a), req, c in zip(where, reqs, comps):
            m = _BOXED.findall(c.text)
            ans = m[-1] if m else None
            answers[n][r][a] = ans
            records[n].rounds[r].append(Turn(a, ans, ans == questions[n].gold, req.temperature, req.top_p,
                                             tuple(jobs[n][0].peers[r][a])))
    return records


def random_schedules(n: int, n_agents: int = 3, rounds: int = 1, mask_p: float = 0.5, t_min: float = 0.1,
                     t_max: float = 1.2, seed: int = 0, temperature0: float = 0.7, top_p: float = 0.9) -> list[Schedule]:
    """The schedules `--collect` uses: round 0 at temperature0, then random masks and per-agent temperatures."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        temps = [tuple([temperature0] * n_agents)]
        peers = [tuple(() for _ in range(n_agents))]
        for _ in range(rounds):
            mask = rng.random((n_agents, n_agents)) < mask_p
            np.fill_diagonal(mask, False)
            peers.append(tuple(tuple(int(j) for j in np.flatnonzero(mask[i])) for i in range(n_agents)))
            temps.append(tuple(float(t) for t in rng.uniform(t_min, t_max, n_agents)))
        out.append(Schedule(tuple(temps), tuple(tuple([top_p] * n_agents) for _ in temps), tuple(peers)))
    return out


def write_records(records: Sequence[DebateRecord], path: str | Path) -> None:
    """Write records as minimal DebateTrace-shaped JSONL (the fields this script reads), e.g. for tests."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for rec in records:
            rounds = [[{"agent": t.agent, "round": r, "answer_key": t.answer, "correct": t.correct,
                        "temperature": t.temperature, "top_p": t.top_p, "peers": list(t.peers)} for t in turns]
                      for r, turns in enumerate(rec.rounds)]
            f.write(json.dumps({"question_id": rec.question_id, "rounds": rounds}) + "\n")


# ---------------------------------------------------------------- report
def comparison_table(real: dict[str, Ratio], sims: dict[str, dict[str, Ratio]]) -> str:
    head = "| statistic | real (k/n) | real rate | " + " | ".join(sims) + " |"
    sep = "|---|---:|---:|" + "---:|" * len(sims)
    rows = [head, sep]
    for name, r in real.items():
        cells = [f"{s[name].rate:.3f}" if name in s and s[name].den else "–" for s in sims.values()]
        rows.append(f"| {name} | {r.num}/{r.den} | {r.rate:.3f} | " + " | ".join(cells) + " |" if r.den
                    else f"| {name} | 0/0 | – | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def params_table(prior: SimParams, fitted: SimParams) -> str:
    rows = ["| parameter | default (prior centre) | fitted |", "|---|---:|---:|"]
    for f in fields(SimParams):
        a, b = getattr(prior, f.name), getattr(fitted, f.name)
        fmt = (lambda v: "[" + ", ".join(f"{x:.3f}" for x in v) + "]") if f.name == "skills" else (lambda v: f"{v:.3f}")
        rows.append(f"| {f.name} | {fmt(a)} | {fmt(b)} |")
    return "\n".join(rows)


def run_fit(traces: str, out: str, report: str | None, replicates: int, seed: int, command: str) -> dict[str, Any]:
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
    from dear.llm.registry import make_backend

    questions = tasks.load(task, split=split, n=n, seed=seed)
    rng = np.random.default_rng(seed)
    cfg = DebateConfig(n_agents=n_agents, n_rounds=rounds, max_tokens=max_tokens, seed=seed)
    t0 = time.perf_counter()
    kwargs = {"n_parallel": parallel} if parallel and llm.split(":")[0] in ("local", "smoke") else {}
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
    ap = argparse.ArgumentParser(prog="python -m eval.fit_sim", description=__doc__.split("\n")[0])
    ap.add_argument("--traces", help="debate traces JSONL to fit (with --collect: where to write them)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="fitted SimParams JSON (name must contain 'synthetic')")
    ap.add_argument("--report", default=DEFAULT_REPORT, help="Markdown report (fitted sim vs real)")
    ap.add_argument("--replicates", type=int, default=200, help="synthetic questions per logged debate schedule")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--collect", type=int, metavar="N", help="run the real model on N questions first")
    ap.add_argument("--llm", default="local", help="backend spec for --collect (see dear.llm.registry)")
    ap.add_argument("--task", default="gsm8k")
    ap.add_argument("--split", default="test")
    ap.add_argument("--n-rounds", type=int, default=1, help="exchange rounds for --collect")
    ap.add_argument("--n-agents", type=int, default=3)
    add_renamed_flags(ap, {"--agents": "--n-agents", "--rounds": "--n-rounds"})  # old names (issue 16)
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--mask-p", type=float, default=0.5)
    ap.add_argument("--t-min", type=float, default=0.1)
    ap.add_argument("--t-max", type=float, default=1.2)
    ap.add_argument("--parallel", type=int, help="llama.cpp decoding slots for --collect (local/smoke backends)")
    ap.add_argument("--chunk", type=int, help="with --collect: debates per batch (traces are appended per chunk)")
    ap.add_argument("--fit", action="store_true", help="with --collect: fit right after collecting")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per loopback request is noise
    command = "python -m eval.fit_sim " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
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
    run_cli(main, "python -m eval.fit_sim")
