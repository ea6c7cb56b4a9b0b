"""The objective every comparison judges by, and the terminal reward DEAR is trained on, written once:

    score - token_cost * tokens / 1000

where the score is 1 when the plurality answer is correct and 1/k for a k-way tie holding it (dear.vote's tie rule)
and tokens are every prompt and completion token the debate spent. The environment pays it at the end of a debate
(envs/reward.py); the learning check, the fitted rules over replayed orders and the plots compare methods by it.
"""

from __future__ import annotations

TOKENS_PER_PRICE = 1000  # token_cost is a price per this many tokens


def token_penalty(tokens: float, token_cost: float) -> float:
    """What `tokens` cost in units of accuracy at price `token_cost` per 1,000 tokens."""
    return token_cost * tokens / TOKENS_PER_PRICE


def objective(score: float, tokens: float, token_cost: float) -> float:
    """score - token_cost * tokens / 1000: a debate's terminal reward, or a method's mean accuracy and mean tokens
    per question (the objective is linear, so the mean of rewards is the objective of the means)."""
    return score - token_penalty(tokens, token_cost)
