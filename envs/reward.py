"""The debate env's reward: the terminal objective (dear/objective.py, re-exported here) and the shaping potential.

Terminal reward: score(plurality answer) - token_cost * tokens / 1000 (`objective`), the one every comparison judges
by (the learning check, fitted rules, plots).

Shaping (optional, envs/debate_env.py): potential-based (Ng, Harada & Russell 1999), Phi(s_r) = the score of the vote
the debate would take after round r, Phi = 0 at the terminal state; step r adds coef * (gamma Phi(s_r) - Phi(s_{r-1})).
"""

from __future__ import annotations

from dear.debate.engine import Debate
from dear.metrics import round_vote
from dear.objective import objective, token_penalty

__all__ = ["objective", "potential", "shaping_term", "token_penalty"]

def potential(d: Debate) -> float:
    """Phi of the shaping term: the score of the last completed round's plurality (ties as expected values).
    It removes from the return the part fixed by round 0 (whether its plurality was right), the largest share of
    the return's variance, without moving the optimum."""
    turns = d.voters(d.decision)
    return round_vote([t.answer_key for t in turns], [t.correct for t in turns]).score if turns else 0.0


def shaping_term(coef: float, gamma: float, phi_next: float, phi_prev: float) -> float:
    """coef * (gamma * Phi(s') - Phi(s)); Phi(terminal) = 0 keeps the optimal policy unchanged."""
    return coef * (gamma * phi_next - phi_prev)
