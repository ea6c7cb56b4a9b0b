"""Float64 numpy reference of subjective logic and Dempster-Shafer fusion, written as plain loops.

Slow on purpose: every formula is spelled out term by term (the conflict as the double sum over p != q) so
the tests can check the vectorised torch code in `subjective_logic.py` / `dempster_shafer.py` against it.
Same rules, same constants (total-conflict fallback, evidence floor) as the torch code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dear.belief.dempster_shafer import EVIDENCE_U_FLOOR, TOTAL_CONFLICT_EPS


@dataclass
class RefOpinion:
    b: np.ndarray  # (B, V, V) float64
    u: np.ndarray  # (B, V) float64


@dataclass
class RefCombined:
    b: np.ndarray  # (V,)
    u: float
    conflict: float


@dataclass
class RefFused:
    b: np.ndarray  # (B, V, V)
    u: np.ndarray  # (B, V)
    conflict: np.ndarray  # (B, V)
    evidence: np.ndarray  # (B, V, V)


def ref_opinions(e: np.ndarray) -> RefOpinion:
    e = np.asarray(e, dtype=np.float64)
    batch, num_agents, _ = e.shape
    b = np.zeros((batch, num_agents, num_agents))
    u = np.zeros((batch, num_agents))
    for bt in range(batch):
        for i in range(num_agents):
            total = sum(e[bt, i, j] for j in range(num_agents) if j != i)
            strength = total + num_agents
            for j in range(num_agents):
                if j != i:
                    b[bt, i, j] = e[bt, i, j] / strength
            u[bt, i] = num_agents / strength
    return RefOpinion(b=b, u=u)


def ref_combine(b1: np.ndarray, u1: float, b2: np.ndarray, u2: float) -> RefCombined:
    num = len(b1)
    conflict = sum(b1[p] * b2[q] for p in range(num) for q in range(num) if p != q)
    raw_b = np.array([b1[k] * b2[k] + b1[k] * u2 + b2[k] * u1 for k in range(num)])
    raw_u = u1 * u2
    # The design's literal 1 - C (the torch code sums the raw masses instead; equal for valid opinions).
    normaliser = 1.0 - conflict
    if normaliser < TOTAL_CONFLICT_EPS:  # Yager: conflict mass to the whole frame
        return RefCombined(b=raw_b, u=raw_u + conflict, conflict=min(max(conflict, 0.0), 1.0))
    return RefCombined(b=raw_b / normaliser, u=raw_u / normaliser, conflict=min(max(conflict, 0.0), 1.0))


def ref_fuse(op: RefOpinion, mask: np.ndarray, rule: str = "dst") -> RefFused:
    b_in, u_in = np.asarray(op.b, dtype=np.float64), np.asarray(op.u, dtype=np.float64)
    batch, num_agents, _ = b_in.shape
    b = np.zeros_like(b_in)
    u = np.zeros_like(u_in)
    conflict = np.zeros_like(u_in)
    for bt in range(batch):
        for i in range(num_agents):
            peers = [j for j in range(num_agents) if mask[bt, i, j]]
            cur_b, cur_u, kept = b_in[bt, i].copy(), float(u_in[bt, i]), 1.0
            for j in peers:
                step = ref_combine(cur_b, cur_u, b_in[bt, j], float(u_in[bt, j]))
                cur_b, cur_u, kept = step.b, step.u, kept * (1.0 - step.conflict)
            if rule == "dst":
                b[bt, i], u[bt, i], conflict[bt, i] = cur_b, cur_u, 1.0 - kept
            elif rule == "mean":  # the ablation reports no Dempster conflict (stays 0)
                members = [i] + peers
                b[bt, i] = sum(b_in[bt, j] for j in members) / len(members)
                u[bt, i] = sum(u_in[bt, j] for j in members) / len(members)
            else:
                raise ValueError(f"unknown fusion rule {rule!r}")
    evidence = b * (num_agents / np.maximum(u, EVIDENCE_U_FLOOR))[..., None]
    return RefFused(b=b, u=u, conflict=conflict, evidence=evidence)
