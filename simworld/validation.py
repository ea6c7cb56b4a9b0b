"""Out-of-sample validation of a fitted simulator on held-out debates: log-likelihood per transition against a
null model, one-step calibration of C→I and I→C with Wilson intervals, round-0 predictions, and the simulated
MAD reference debates against the real ones."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import binomtest

from dear.debate.engine import DebateConfig, DebateEngine, summarize
from dear.debate.profiles import parse_profile, without_backend
from dear.debate.protocols import MADProtocol
from dear.debate.trace import DebateTrace
from dear.sim.backend import SimBackend
from dear.sim.likelihood import DELTA, FitData, likelihood_parts, round0_loglik_grid, transition_outcomes
from dear.sim.model import difficulty_logit, excess, kappa_of, sigmoid, wrong_label_probs
from dear.sim.params import SimParams
from dear.sim.records import Transition
from dear.tasks.synthetic import load_synthetic
from simworld.rates import TEMP_BINS


# ---------------------------------------------------------------- models evaluated on held-out data
@dataclass(frozen=True)
class NullModel:
    """An agent keeps its answer with probability k; a wrong (or missing) answer that changes is correct w.p. q."""

    k: float
    q: float

    @classmethod
    def fit(cls, trs: Sequence[Transition]) -> NullModel:
        has = [t for t in trs if t.own is not None]
        kept = sum((t.new_correct if t.own_correct else (t.new is not None and t.new == t.own)) for t in has)
        changed_w = [t for t in trs if not t.own_correct and not (t.own is not None and t.new == t.own)]
        k = kept / max(1, len(has))
        q = sum(t.new_correct for t in changed_w) / max(1, len(changed_w))
        eps = 1e-6
        return cls(min(max(k, eps), 1 - eps), min(max(q, eps), 1 - eps))

    def p_new_correct(self, t: Transition) -> float:
        if t.own_correct:
            return self.k
        return self.q if t.own is None else (1 - self.k) * self.q

    def loglik(self, trs: Sequence[Transition]) -> float:
        total = 0.0
        for t in trs:
            if t.own_correct:
                p = self.k if t.new_correct else 1 - self.k
            elif t.new_correct:
                p = self.p_new_correct(t)
            elif t.own is not None and t.new == t.own:
                p = self.k
            else:
                p = (1 - self.q) if t.own is None else (1 - self.k) * (1 - self.q)
            total += math.log(max(p, 1e-12))
        return total


def heldout_loglik(p: SimParams, data: FitData) -> float:
    """log P(transitions | round 0) of the held-out data under `p`."""
    return likelihood_parts(p, data).transitions_loglik


def one_step_predictions(p: SimParams, data: FitData) -> np.ndarray:
    """P(new answer correct) for every transition, given its debate's round 0 and earlier rounds (the question
    difficulty's posterior on the grid after what was seen before that round)."""
    if not data.transitions:
        return np.zeros(0)
    ll_seen = round0_loglik_grid(p, data.round0)  # (Q, G)
    grid = transition_outcomes(p, data.arrays, kappa_of(p))
    rounds = np.array([t.round for t in data.transitions])
    out = np.zeros(len(rounds))
    for r in sorted(set(rounds.tolist())):
        idx = np.flatnonzero(rounds == r)
        w = ll_seen[data.debate[idx]]
        w = np.exp(w - w.max(1, keepdims=True))
        w /= w.sum(1, keepdims=True)
        out[idx] = (w * grid.p_new_correct[idx]).sum(1)
        np.add.at(ll_seen, data.debate[idx], grid.log_prob[idx])
    return out


def round0_predictions(p: SimParams, data: FitData) -> tuple[float, float]:
    """Predicted round-0 accuracy (mean over turns) and unanimity (mean over questions)."""
    pc, present = _round0_correct(p, data)
    V = data.round0.n_agents
    acc = float(pc.mean(2)[present].mean())
    same_wrong = ((1 - p.trap_share) * float((wrong_label_probs(p)[1:] ** V).sum())
                  + p.trap_share * float((wrong_label_probs(p, trap=True)[1:] ** V).sum()))
    unan = (np.prod(pc, 1) + np.prod(1 - pc, 1) * same_wrong).mean(1)
    return acc, float(unan.mean())


def _round0_correct(p: SimParams, data: FitData) -> tuple[np.ndarray, np.ndarray]:
    """P(correct) of every round-0 turn on the difficulty grid (questions × agents × grid), and which turns exist."""
    V, C, T, P, present = data.round0
    skills = np.array([p.skill(a) for a in range(V)])
    d = difficulty_logit(p, DELTA)
    return sigmoid(skills[None, :, None] - d[None, None, :] - p.temp_penalty * excess(p, T, P)[:, :, None]), present


def round0_by_agent(p: SimParams, data: FitData) -> list[dict[str, Any]]:
    """Round-0 accuracy per agent: observed (k of n) and predicted (difficulty integrated out)."""
    pc, present = _round0_correct(p, data)
    _, C, _, _, _ = data.round0
    rows = []
    for a in range(pc.shape[1]):
        m = present[:, a]
        rows.append({"agent": a, "observed": int(C[m, a].sum()), "n": int(m.sum()),
                     "predicted": float(pc.mean(2)[m, a].mean()) if m.any() else float("nan")})
    return rows


# ---------------------------------------------------------------- calibration
def _groups(t: Transition) -> list[str]:
    """The calibration groups a transition belongs to: all, whom it read, its temperature bin, its agent."""
    read = "read nobody" if t.n_read == 0 else ("read peers, all agree" if t.n_dis == 0 else
                                                 "read peers, some disagree")
    temp = next(f"T in [{lo:.1f}, {min(hi, 2.0):.1f})" for lo, hi in TEMP_BINS if lo <= t.temperature < hi)
    return ["all", read, temp, agent_group(t.agent)]


def agent_group(agent: int) -> str:
    return f"agent {agent}"


GROUP_ORDER = ["all", "read nobody", "read peers, all agree", "read peers, some disagree"] + [
    f"T in [{lo:.1f}, {min(hi, 2.0):.1f})" for lo, hi in TEMP_BINS]


def wilson(k: float, n: int) -> tuple[float, float]:
    """Wilson 95 % interval of k successes in n; a fractional k (ties scored as expected values) is rounded."""
    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(int(round(k)), n).proportion_ci(0.95, method="wilson")
    return float(ci.low), float(ci.high)


def calibration(trs: Sequence[Transition], preds: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Rows: group × (C→I over own-correct turns, I→C over own-wrong turns); predicted = mean predicted rate.
    Groups: GROUP_ORDER, then one per agent (its pool position)."""
    rows = []
    agents = sorted({t.agent for t in trs})
    for g in GROUP_ORDER + [agent_group(a) for a in agents]:
        idx = [k for k, t in enumerate(trs) if g in _groups(t)]
        for name, own_c in (("C→I", True), ("I→C", False)):
            sel = [k for k in idx if trs[k].own_correct == own_c]
            n = len(sel)
            k_obs = sum((not trs[k].new_correct) if own_c else trs[k].new_correct for k in sel)
            lo, hi = wilson(k_obs, n)
            row = {"group": g, "flip": name, "n": n, "observed": k_obs, "rate": k_obs / n if n else float("nan"),
                   "ci_low": lo, "ci_high": hi}
            for model, pr in preds.items():
                rate = float(np.mean([(1 - pr[k]) if own_c else pr[k] for k in sel])) if n else float("nan")
                row[model] = rate
                row[f"{model}_inside"] = bool(n and lo <= rate <= hi)
            rows.append(row)
    return rows


# ---------------------------------------------------------------- MAD reference
def sim_debate_config(settings: dict[str, Any], seed: int) -> DebateConfig:
    """The corpus's debate settings (V, R, max tokens, layout, the agents' profiles in pool order) for the sim:
    one backend, so each profile keeps its reply style and token limit and loses its backend."""
    profiles = settings.get("agent_profiles")
    return DebateConfig(n_agents=int(settings.get("n_agents", 3)), n_rounds=int(settings.get("n_rounds", 2)),
                        max_tokens=int(settings.get("max_tokens", 384)), seed=seed,
                        layout=settings.get("layout", "single"),
                        agent_profiles=None if profiles is None else tuple(
                            parse_profile(without_backend(name)) for name in profiles))


def simulate_mad(p: SimParams, settings: dict[str, Any], n: int, seed: int) -> dict[str, Any]:
    """MAD debates of the sim on n synthetic test questions (the corpus's V, R, max tokens, layout, profiles):
    accuracy, tokens, per-agent completion tokens."""
    cfg = sim_debate_config(settings, seed)
    engine = DebateEngine(SimBackend(p, seed=seed), cfg)
    proto = MADProtocol(cfg.n_agents, cfg.n_rounds, float(settings.get("mad_temperature", 0.7)),
                        float(settings.get("mad_top_p", 0.9)))
    debates = engine.run(load_synthetic(n, seed=seed, split="test"), proto)
    s = summarize(debates)  # accuracy: ties as expected values
    comp = sum(d.trace.completion_tokens for d in debates) / max(1, n)
    return {"n": n, "accuracy": s.accuracy, "ci": list(wilson(s.accuracy * n, n)), "tokens_per_question":
            s.tokens_per_question, "completion_tokens_per_question": comp,
            "completion_tokens_per_agent": completion_tokens_per_agent([d.trace.to_dict() for d in debates])}


def real_mad(traces: Sequence[dict]) -> dict[str, Any]:
    """The corpus's MAD debates: accuracy (ties as expected values) with its interval, tokens per question."""
    n = len(traces)
    k = sum(DebateTrace.from_dict(t).final_expected for t in traces)  # ties as expected values
    return {"n": n, "accuracy": k / max(1, n), "ci": list(wilson(k, n)),
            "tokens_per_question": sum(t["prompt_tokens"] + t["completion_tokens"] for t in traces) / max(1, n),
            "completion_tokens_per_question": sum(t["completion_tokens"] for t in traces) / max(1, n),
            "completion_tokens_per_agent": completion_tokens_per_agent(traces)}


def completion_tokens_per_agent(traces: Sequence[dict]) -> list[float]:
    """Mean completion tokens of one turn, per agent (turns that did not fail)."""
    sums: dict[int, list[int]] = {}
    for tr in traces:
        for turns in tr["rounds"]:
            for t in turns:
                if t.get("error") is None:
                    sums.setdefault(int(t["agent"]), []).append(int(t["completion_tokens"]))
    return [float(np.mean(sums[a])) for a in sorted(sums)]

