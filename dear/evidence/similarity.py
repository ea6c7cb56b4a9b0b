"""Pairwise evidence between debating agents (DESIGN §3).

    e_ij = 1/2 (e_ij^con + e_ij^rea) = 1/4 (2 + cos(h_i, h_j) + cos(c_i, c_j))  in [0, 1]

for B debates x V agents at once; h are reasoning embeddings, c conclusion embeddings.
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
