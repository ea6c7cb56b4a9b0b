"""Dempster-Shafer fusion of an agent's opinion with its selected peers' opinions (docs/DESIGN.md §5).

An opinion (b_1..b_V, u) is a mass function over the V singletons {answer of agent k} plus the whole frame
(mass u). Dempster's rule for two of them:

    C   = sum_{p != q} b1_p b2_q                              (conflict: mass on empty intersections)
    b_k = (b1_k b2_k + b1_k u2 + b2_k u1) / (1 - C)
    u   = u1 u2 / (1 - C)

It is commutative and associative, so agent i folds its own opinion with each selected peer in any order.

Total conflict. When 1 - C ~ 0 (both opinions dogmatic, u ~ 0, on different answers) Dempster's rule divides
by ~0. For such a step we use Yager's rule instead: the conflict mass goes to the whole frame
(b_k = b1_k b2_k + b1_k u2 + b2_k u1, u = u1 u2 + C). Why Yager and not "mean of the two": it needs no
division, always yields a valid mass function (non-negative, sums to 1), and it reports what really happened
-- two sources flatly contradict each other -- as ignorance (u ~ 1), which is the honest input for the
behavior policy; a mean would claim belief in two contradictory answers at once. Opinions built by
`opinions()` always have u > 1/2, so real debates never reach this branch; it exists so that no input can
produce NaN/inf. Associativity holds wherever Dempster's rule is defined (1 - C >= TOTAL_CONFLICT_EPS).

Accumulated conflict of agent i (Fused.conflict; rule "dst" only, 0 under the "mean" ablation, see `fuse`) is

    K_i = 1 - prod_steps (1 - C_step)

over the fold of its own opinion with its selected peers. prod (1 - C_step) is the mass the *unnormalised*
conjunctive combination of all those opinions leaves on non-empty sets, so K_i is the mass it puts on the
empty set: the conflict of the whole group at once, independent of fold order. K_i = 0 when agent i reads no
one.

Fused evidence: E_hat_i = b_hat_i * V / u_hat_i (vector of V), with u_hat floored at EVIDENCE_U_FLOOR so a
dogmatic fused opinion (u_hat = 0, infinite evidence in subjective logic) stays finite.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dear.belief.subjective_logic import Opinion, check_square_batch

FUSION_RULES = ("dst", "mean")
# Below this normaliser Dempster's rule is numerically meaningless; Yager's rule takes over (module docstring).
TOTAL_CONFLICT_EPS = 1e-6
# Floor on u_hat when turning a fused opinion back into evidence, so E_hat stays finite (<= V / 1e-6).
EVIDENCE_U_FLOOR = 1e-6
# Opinion masses may be off by float rounding only.
_MASS_TOL = 1e-4


@dataclass
class Combined:
    """Result of combining two opinions with Dempster's rule; leading dims are broadcast."""

    b: torch.Tensor  # (..., V)
    u: torch.Tensor  # (...)
    conflict: torch.Tensor  # (...) C of this combination


@dataclass
class Fused:
    """Each agent's opinion fused with its selected peers' (see module docstring for conflict)."""

    b: torch.Tensor  # (B, V, V): b[bt, i] = agent i's fused belief vector
    u: torch.Tensor  # (B, V): fused uncertainty u_hat_i
    conflict: torch.Tensor  # (B, V): accumulated conflict K_i = 1 - prod(1 - C_step)
    evidence: torch.Tensor  # (B, V, V): E_hat_i = b_hat_i * V / u_hat_i


def combine(b1: torch.Tensor, u1: torch.Tensor, b2: torch.Tensor, u2: torch.Tensor) -> Combined:
    """Dempster's rule for two opinions (b (..., V), u (...)); Yager's rule where 1 - C < TOTAL_CONFLICT_EPS."""
    u1e, u2e = u1.unsqueeze(-1), u2.unsqueeze(-1)
    # C = sum_{p != q} b1_p b2_q = (sum b1)(sum b2) - sum_k b1_k b2_k, in O(V) instead of O(V^2).
    conflict = (b1.sum(-1) * b2.sum(-1) - (b1 * b2).sum(-1)).clamp(0.0, 1.0)
    raw_b = b1 * b2 + b1 * u2e + b2 * u1e
    raw_u = u1 * u2
    # The raw masses add up to exactly 1 - C for valid inputs; summing them is more accurate than 1 - C
    # near total conflict (no cancellation) and makes every output sum to 1 to rounding.
    normaliser = raw_b.sum(-1) + raw_u
    total = normaliser < TOTAL_CONFLICT_EPS
    safe = torch.where(total, torch.ones_like(normaliser), normaliser)
    b = torch.where(total.unsqueeze(-1), raw_b, raw_b / safe.unsqueeze(-1))
    u = torch.where(total, raw_u + conflict, raw_u / safe)
    return Combined(b=b, u=u, conflict=conflict)


def _check_opinion(op: Opinion) -> None:
    if not isinstance(op, Opinion):
        raise ValueError(f"fuse() takes an Opinion, got {type(op).__name__}")
    check_square_batch("opinion.b", op.b)
    batch, num_agents = op.b.shape[0], op.b.shape[-1]
    if tuple(op.u.shape) != (batch, num_agents):
        raise ValueError(f"opinion.u must have shape (B, V) = {(batch, num_agents)}, got {tuple(op.u.shape)}")
    for name, x in (("opinion.b", op.b), ("opinion.u", op.u)):
        if not bool(torch.isfinite(x).all()):
            where = tuple(int(k) for k in torch.nonzero(~torch.isfinite(x))[0])
            raise ValueError(f"{name}{list(where)} is NaN or inf")
        if bool(((x < -_MASS_TOL) | (x > 1 + _MASS_TOL)).any()):
            raise ValueError(f"{name} has a mass outside [0, 1]")
    total = op.b.sum(-1) + op.u
    if bool(((total - 1).abs() > _MASS_TOL).any()):
        b, i = (int(k) for k in torch.nonzero((total - 1).abs() > _MASS_TOL)[0])
        raise ValueError(f"opinion of agent {i} in debate {b} has masses summing to {float(total[b, i]):.6g}, "
                         "not 1 (u_i + sum_k b_ik must be 1)")


def _check_mask(mask: torch.Tensor, batch: int, num_agents: int, device: torch.device) -> torch.Tensor:
    if isinstance(mask, np.ndarray):
        mask = torch.from_numpy(mask)
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask must be a bool tensor (B, V, V), got {type(mask).__name__}")
    if tuple(mask.shape) != (batch, num_agents, num_agents):
        raise ValueError(f"mask must have shape (B, V, V) = {(batch, num_agents, num_agents)} to match the "
                         f"opinions, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"mask of dtype {mask.dtype} must hold only 0/1 (or be bool)")
        mask = mask != 0
    diagonal = torch.diagonal(mask, dim1=-2, dim2=-1)
    if bool(diagonal.any()):
        b, i = (int(k) for k in torch.nonzero(diagonal)[0])
        raise ValueError(f"mask[{b}, {i}, {i}] is True: a self-loop (agent {i} reading itself); the own opinion "
                         "is always included, so the diagonal must be False")
    return mask.to(device)


def _dst_fold(op: Opinion, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fused_b, fused_u = op.b, op.u
    kept = torch.ones_like(op.u)  # prod (1 - C_step): mass left on non-empty sets
    for peer in range(op.num_agents):  # at most V steps; every agent i and debate at once
        reads = mask[:, :, peer]  # (B, V): agent i reads this peer
        if not bool(reads.any()):
            continue
        step = combine(fused_b, fused_u, op.b[:, peer : peer + 1, :], op.u[:, peer : peer + 1])
        fused_b = torch.where(reads.unsqueeze(-1), step.b, fused_b)
        fused_u = torch.where(reads, step.u, fused_u)
        kept = torch.where(reads, kept * (1.0 - step.conflict), kept)
    return fused_b, fused_u, (1.0 - kept).clamp(0.0, 1.0)


def fuse(op: Opinion, mask: torch.Tensor, rule: str = "dst") -> Fused:
    """Fuse each agent's opinion with the peers it reads (mask[bt, i, j] = True: agent i reads agent j).

    rule="dst": Dempster's rule folded over the selected peers; conflict = the accumulated K_i.
    rule="mean" (the paper's "Mean" ablation, docs/DESIGN.md §5): plain mean of the own and selected opinions' b and u,
    and conflict = 0 for every agent. The paper credits DST with exposing the conflict between opinions
    ("naive mean pooling flattens the fine structure of consensus and disagreement"; the Mean ablation loses
    "DST's distinguishing of conflict"), so the ablation carries no DST quantity at all: the entry keeps
    its slot in the behavior observation (same network shape) but is a constant 0 and tells the policy nothing.
    An agent that reads no one keeps its own opinion (and conflict 0) under both rules.
    """
    if rule not in FUSION_RULES:
        raise ValueError(f"unknown fusion rule {rule!r}; expected one of {FUSION_RULES}")
    _check_opinion(op)
    mask = _check_mask(mask, op.batch_size, op.num_agents, op.b.device)
    if rule == "mean":
        reads = mask.to(op.b.dtype)  # (B, V, V); reads @ op.b sums the selected peers' belief vectors
        count = 1.0 + reads.sum(-1)
        fused_b = (op.b + reads @ op.b) / count.unsqueeze(-1)
        fused_u = (op.u + (reads @ op.u.unsqueeze(-1)).squeeze(-1)) / count
        conflict = torch.zeros_like(fused_u)  # no Dempster conflict in the ablation (docstring)
    else:
        fused_b, fused_u, conflict = _dst_fold(op, mask)
    evidence = fused_b * (op.num_agents / fused_u.clamp_min(EVIDENCE_U_FLOOR)).unsqueeze(-1)
    return Fused(b=fused_b, u=fused_u, conflict=conflict, evidence=evidence)
