"""Pairwise evidence between debating agents (docs/DESIGN.md §3).

The paper's formula (the default):

    e_ij = 1/2 (e_ij^con + e_ij^rea) = 1/4 (2 + cos(h_i, h_j) + cos(c_i, c_j))  in [0, 1]

for B debates x V agents at once; h are reasoning embeddings, c conclusion embeddings.

Answer-aware evidence (an option, off by default; `answer_aware_evidence`):

    e_ij^aa = (1 − w)·e_ij + w·𝟙[a_i = a_j ≠ ∅]  in [0, 1],   w ∈ [0, 1]

where a_i is agent i's parsed, normalised answer (∅ = no parsable answer, which agrees with nobody). On real
texts the embedding barely separates agreeing from differing pairs (d′ ≈ 1 with MiniLM in
results/evidence-pilot-gsm8k/evidence_report.md, which names its command); the parsed answers do, at no extra
cost. w = 0 is the paper's e_ij; e_ii = 1 is kept.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

ArrayT = TypeVar("ArrayT", torch.Tensor, np.ndarray)

# A row with a norm below this has no direction, so its cosine is undefined.
_MIN_NORM = 1e-12


def _validate(name: str, x: torch.Tensor) -> None:
    if x.ndim != 3:
        raise ValueError(f"{name} must have shape (B, V, d) (debates, agents, embedding dim), got shape "
                         f"{tuple(x.shape)}; add a batch axis with x[None] for one debate")
    batch, agents, dim = x.shape
    if agents < 2:
        raise ValueError(f"{name} has V={agents} agents; a debate needs V >= 2")
    if batch == 0 or dim == 0:
        raise ValueError(f"{name} has an empty axis: shape {tuple(x.shape)}")
    finite = torch.isfinite(x).all(dim=-1)
    if not bool(finite.all()):
        b, i = (int(k) for k in torch.nonzero(~finite)[0])
        raise ValueError(f"{name}[{b}, {i}] contains NaN or inf")
    zero = torch.linalg.vector_norm(x, dim=-1) < _MIN_NORM
    if bool(zero.any()):
        b, i = (int(k) for k in torch.nonzero(zero)[0])
        raise ValueError(f"{name}[{b}, {i}] is a zero-norm vector; its cosine similarity is undefined")


def _cosine_matrix(x: torch.Tensor) -> torch.Tensor:
    x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x @ x.transpose(-1, -2)


def pairwise_evidence(h: ArrayT, c: ArrayT) -> ArrayT:
    """(B, V, d) reasoning and conclusion embeddings -> (B, V, V) evidence e_ij in [0, 1].

    Inputs need not be normalised (cosines are computed here). Returns the input's type (torch tensor or
    numpy array) and floating dtype; e_ii = 1 is kept (the belief step excludes self).
    """
    if isinstance(h, np.ndarray) and isinstance(c, np.ndarray):
        as_numpy = True
        th, tc = torch.from_numpy(np.asarray(h)), torch.from_numpy(np.asarray(c))
    elif isinstance(h, torch.Tensor) and isinstance(c, torch.Tensor):
        as_numpy = False
        th, tc = h, c
    else:
        raise ValueError(f"h and c must both be torch tensors or both numpy arrays, got "
                         f"{type(h).__name__} and {type(c).__name__}")
    if th.shape != tc.shape:
        raise ValueError(f"h and c shapes differ: h {tuple(th.shape)} vs c {tuple(tc.shape)}; both must be "
                         "(B, V, d) for the same debates and agents")
    if not th.is_floating_point():
        th, tc = th.float(), tc.float()
    if th.dtype != tc.dtype:
        common = torch.promote_types(th.dtype, tc.dtype)
        th, tc = th.to(common), tc.to(common)
    _validate("h", th)
    _validate("c", tc)
    # Rounding can push cosines a hair past +-1; the clamp keeps e a valid [0, 1] evidence value.
    e = (0.25 * (2.0 + _cosine_matrix(th) + _cosine_matrix(tc))).clamp_(0.0, 1.0)
    return e.numpy() if as_numpy else e


def answer_aware_evidence(e: ArrayT, answer_keys, weight: float = 0.5) -> ArrayT:
    """e^aa = (1 − w)·e + w·[a_i = a_j ≠ None] for (B, V, V) evidence `e` and (B, V) answer keys (module docstring).

    Returns the type and dtype of `e`; the diagonal stays 1."""
    if not 0.0 <= float(weight) <= 1.0:
        raise ValueError(f"answer-aware evidence weight must be in [0, 1], got {weight}")
    keys = [list(row) for row in answer_keys]
    shape = tuple(e.shape)
    if len(shape) != 3 or shape[1] != shape[2] or len(keys) != shape[0] or any(len(r) != shape[1] for r in keys):
        raise ValueError(f"answer_keys must be (B, V) = ({shape[0]}, {shape[1] if len(shape) > 1 else '?'}) for "
                         f"evidence of shape {shape}, got {len(keys)} rows of lengths {[len(r) for r in keys]}")
    agree = np.array([[[a is not None and a == b for b in row] for a in row] for row in keys], dtype=np.float64)
    agree[:, np.arange(shape[1]), np.arange(shape[1])] = 1.0
    if isinstance(e, torch.Tensor):
        return (1.0 - weight) * e + weight * torch.as_tensor(agree, dtype=e.dtype, device=e.device)
    return ((1.0 - weight) * np.asarray(e) + weight * agree).astype(np.asarray(e).dtype)
