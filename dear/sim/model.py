"""The model's equations (module docstring of `dear.sim`), shared by the backend that samples them and the
likelihood that fits them."""

from __future__ import annotations

import numpy as np

from dear.sim.params import SimParams

N_DISTRACTORS = 3  # shared wrong answers per synthetic question (dear/tasks/synthetic.py)


def sigmoid(z):
    """The logistic function σ, elementwise in float64."""
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


def logit(p):
    """log(p / (1 − p)), with p clipped to [1e-6, 1 − 1e-6] so that 0 and 1 stay finite."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def difficulty_logit(p: SimParams, difficulty):
    """d = c + k·logit(δ)."""
    return p.difficulty_center + p.difficulty_scale * logit(difficulty)


def excess(p: SimParams, temperature, top_p):
    """x = (T − T0) + w_p·(P − P0)."""
    return (np.asarray(temperature, dtype=np.float64) - p.t_ref) + p.top_p_weight * (
        np.asarray(top_p, dtype=np.float64) - p.top_p_ref
    )


def p_correct(p: SimParams, skill, d, x, resolve: bool = False):
    """P(an independent draw is correct) = σ(s − d − τ·x [+ β])."""
    return sigmoid(np.asarray(skill) - d - p.temp_penalty * x + (p.resolve_bonus if resolve else 0.0))


def p_move(p: SimParams, n_dis, n_agr, x):
    """P(the agent moves in round ≥ 1): self-revision if it reads nobody, else conformity pressure."""
    n_dis = np.asarray(n_dis, dtype=np.float64)
    n_agr = np.asarray(n_agr, dtype=np.float64)
    alone = p.self_revise_bias + p.self_revise_temp * x
    peers = p.switch_bias + p.switch_disagree * n_dis - p.switch_agree * n_agr + p.switch_temp * x
    return sigmoid(np.where(n_dis + n_agr > 0, peers, alone))


def distractor_weights(p: SimParams, n: int) -> np.ndarray:
    """P(wrong answer = distractor i | wrong, not idiosyncratic) = softmax(−λ·i)."""
    w = np.exp(-p.distractor_decay * np.arange(n, dtype=np.float64))
    return w / w.sum()


def wrong_label_probs(p: SimParams, trap: bool = False) -> np.ndarray:
    """P(a wrong draw is idiosyncratic (label 0) or distractor i (label i + 1)): on a trap question the first
    distractor first takes a share ρ, then u and softmax(−λ·i) split the rest."""
    probs = np.concatenate([[p.p_unique_wrong], (1 - p.p_unique_wrong) * distractor_weights(p, N_DISTRACTORS)])
    if trap:
        probs = (1 - p.trap_pull) * probs
        probs[1] += p.trap_pull
    return probs


def trap_probability(p: SimParams, d):
    """P(a question of difficulty logit d is a trap) = σ(logit(π) + γ·(d − c)); 0 without traps (π = 0)."""
    if p.trap_share <= 0:
        return np.zeros_like(np.asarray(d, dtype=np.float64))
    return sigmoid(logit(p.trap_share) + p.trap_slope * (np.asarray(d, dtype=np.float64) - p.difficulty_center))


def kappa_of(p: SimParams) -> float:
    """P(two independent wrong draws to one question give the same answer), averaged over questions (δ uniform):
    Σ_{i≥1} P(i)², which is (1 − u)²·Σ w_i² without traps."""
    plain = float((wrong_label_probs(p)[1:] ** 2).sum())
    trapped = float((wrong_label_probs(p, trap=True)[1:] ** 2).sum())
    share = float(np.mean(trap_probability(p, difficulty_logit(p, (np.arange(64) + 0.5) / 64))))
    return (1 - share) * plain + share * trapped
