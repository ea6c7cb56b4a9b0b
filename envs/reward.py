"""The debate env's reward, written once: the terminal objective and the shaping potential.

Terminal reward: score(plurality answer) - token_cost * tokens / 1000 (`objective`), where the score is 1 when the
plurality answer is correct and 1/k for a k-way tie holding it (dear.vote's tie rule) and tokens are every prompt and
completion token the debate spent; the one every comparison judges by (the learning check, the confidence rules'
fitted thresholds, plots).

Shaping (optional, envs/debate_env.py): potential-based (Ng, Harada & Russell 1999), Phi(s_r) = the score of the vote
the debate would take after round r, Phi = 0 at the terminal state; step r adds coef * (gamma Phi(s_r) - Phi(s_{r-1})).
"""

from __future__ import annotations

from dear.debate.engine import Debate
from dear.metrics import round_vote

TOKENS_PER_PRICE = 1000  # token_cost is a price per this many tokens


def token_penalty(tokens: float, token_cost: float) -> float:
    """What `tokens` cost in units of accuracy at price `token_cost` per 1,000 tokens."""
    return token_cost * tokens / TOKENS_PER_PRICE


def objective(score: float, tokens: float, token_cost: float) -> float:
    """score - token_cost * tokens / 1000: a debate's terminal reward, or a method's mean accuracy and mean tokens
    per question (the objective is linear, so the mean of rewards is the objective of the means)."""
    return score - token_penalty(tokens, token_cost)

def potential(d: Debate) -> float:
    """Phi of the shaping term: the score of the last completed round's plurality (ties as expected values).
    It removes from the return the part fixed by round 0 (whether its plurality was right), the largest share of
    the return's variance, without moving the optimum."""
    turns = d.voters(d.decision)
    return round_vote([t.answer_key for t in turns], [t.correct for t in turns]).score if turns else 0.0


def shaping_term(coef: float, gamma: float, phi_next: float, phi_prev: float) -> float:
    """coef * (gamma * Phi(s') - Phi(s)); Phi(terminal) = 0 keeps the optimal policy unchanged."""
    return coef * (gamma * phi_next - phi_prev)
