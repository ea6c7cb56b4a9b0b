"""The likelihood of logged debates under the model (`dear.sim`'s docstring), which the fit maximises: round 0
and every transition, each question's difficulty δ integrated out on a grid (δ ~ U(0, 1))."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dear.sim.model import difficulty_logit, excess, kappa_of, p_correct, p_move, sigmoid
from dear.sim.params import SimParams
from dear.sim.records import DebateRecord, Transition, transitions

N_GRID = 32  # quadrature points over question difficulty δ ∈ (0, 1)
DELTA = (np.arange(N_GRID) + 0.5) / N_GRID


class Round0Arrays(NamedTuple):
    """Round 0 of Q records as (Q, V) arrays; agents absent from a record are marked in `present`."""

    n_agents: int
    correct: np.ndarray
    temperature: np.ndarray
    top_p: np.ndarray
    present: np.ndarray


def round0_arrays(records: Sequence[DebateRecord]) -> Round0Arrays:
    """Round 0 of the records as arrays (a missing agent's sampling set to the engine's default T 0.7, top-p 0.9)."""
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
    return Round0Arrays(V, C, np.nan_to_num(X_T, nan=0.7), np.nan_to_num(X_P, nan=0.9), present)


def round0_loglik_grid(p: SimParams, arrays: Round0Arrays) -> np.ndarray:
    """(Q, G) log-likelihood of each question's round-0 correctness at each difficulty grid point."""
    V, C, T, P, present = arrays
    skills = np.array([p.skill(a) for a in range(V)])
    d = difficulty_logit(p, DELTA)  # (G,)
    x = excess(p, T, P)  # (Q, V)
    pc = sigmoid(skills[None, :, None] - d[None, None, :] - p.temp_penalty * x[:, :, None])  # (Q, V, G)
    pc = np.clip(pc, 1e-9, 1 - 1e-9)
    ll = np.where(present[:, :, None], np.where(C[:, :, None] > 0, np.log(pc), np.log1p(-pc)), 0.0).sum(1)
    return ll  # log-likelihood (Q, G)


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
    d = difficulty_logit(p, DELTA)[None, :]
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


def logmeanexp(a: np.ndarray) -> np.ndarray:
    """log of the row means of exp(a), computed stably (the integral over the δ grid)."""
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
    round0: Round0Arrays
    transitions: list[Transition]
    arrays: TransitionArrays
    debate: np.ndarray

    @classmethod
    def of(cls, records: Sequence[DebateRecord]) -> FitData:
        trs = transitions(records)
        return cls(records, round0_arrays(records), trs, TransitionArrays.of(trs),
                   np.array([t.debate for t in trs], dtype=int))


def likelihood_parts(p: SimParams, data: Sequence[DebateRecord] | FitData,
                     kappa: float | None = None) -> LikelihoodParts:
    """The records' log-likelihood under `p`, per question (`kappa`: P(two wrong draws coincide), default `p`'s)."""
    data = data if isinstance(data, FitData) else FitData.of(data)
    ll0 = round0_loglik_grid(p, data.round0)
    per_q = ll0.copy()
    if data.transitions:
        grid = transition_outcomes(p, data.arrays, kappa_of(p) if kappa is None else kappa)
        np.add.at(per_q, data.debate, grid.log_prob)
    counts = np.bincount(data.debate, minlength=len(data.records))
    return LikelihoodParts(logmeanexp(ll0), logmeanexp(per_q), counts)
