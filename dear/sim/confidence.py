"""The simulated world's confidence: a sample's mean token log-probability m, drawn by whether the sample is right,
with an effect its question's samples share.

On the embedded model's GSM8K bank, log(-m) is close to normal within each class (right samples more confident),
and about half of its variance lies between questions (a hard question's samples are less confident, right or
wrong). So the sim draws log(-m) = mu_c + b_q + e, c = right or wrong, b_q ~ Normal(0, sd_question) fixed per
question (its id and the world's seed), e ~ Normal(0, sd_c) per sample (`SimParams.confidence_*`, fitted by
simworld.confidence_fit, which also says what the fit leaves out). Only the mean is modelled: the record's other
summaries are None.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dear.sim.params import SimParams


def question_effect(params: SimParams, rng: np.random.Generator) -> float:
    """b_q, from a generator seeded by the question alone (every sample of the question gets the same)."""
    return float(rng.normal(0.0, params.confidence_sd_question)) if params.confidence_sd_question > 0 else 0.0


def draw_mean_logprob(params: SimParams, correct: bool, shared: float, rng: np.random.Generator) -> float:
    """One sample's mean token log-probability (SimParams.has_confidence must hold); `shared` = its question's b_q."""
    mu, sd = ((params.confidence_mu_correct, params.confidence_sd_correct) if correct
              else (params.confidence_mu_wrong, params.confidence_sd_wrong))
    return -math.exp(mu + shared + float(rng.normal(0.0, sd)))


def confidence_record(mean_logprob: float, n_tokens: int) -> dict[str, Any]:
    """A confidence record (dear.confidence.ConfidenceRecord's fields) holding only the mean; no per-token arrays."""
    return {"mean_logprob": round(mean_logprob, 4), "lowest_group": None, "tail_mean": None, "answer_mean": None,
            "margin": None, "n_tokens": int(n_tokens), "k": 0}
