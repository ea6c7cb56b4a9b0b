"""Pairwise evidence e_ij = 1/4 (2 + cos(h_i, h_j) + cos(c_i, c_j)): values, types, bad input, pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dear.belief import fuse, opinions
from dear.evidence import make_encoder, pairwise_evidence


def _unit(rng: np.random.Generator, *shape: int) -> np.ndarray:
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_known_values():
    a = np.array([1.0, 0.0, 0.0])
    b = np.array([0.0, 1.0, 0.0])
    h = np.stack([a, a, -a, b])[None]  # agent 1 == agent 0, agent 2 opposite, agent 3 orthogonal
    e = pairwise_evidence(h, h.copy())
    assert e.shape == (1, 4, 4)
    assert e[0, 0, 1] == pytest.approx(1.0)
    assert e[0, 0, 2] == pytest.approx(0.0)
    assert e[0, 0, 3] == pytest.approx(0.5)
    np.testing.assert_allclose(np.diagonal(e[0]), 1.0)
    # reasoning agrees, conclusion opposite -> halfway
    e_mixed = pairwise_evidence(np.stack([a, a])[None], np.stack([a, -a])[None])
    assert e_mixed[0, 0, 1] == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(2, 6), st.integers(1, 16), st.integers(0, 2**32 - 1))
def test_matches_formula_symmetric_in_range(batch, agents, dim, seed):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(batch, agents, dim)) * rng.uniform(0.1, 10, size=(batch, agents, 1))
    c = rng.normal(size=(batch, agents, dim))
    e = pairwise_evidence(h, c)
    hn = h / np.linalg.norm(h, axis=-1, keepdims=True)
    cn = c / np.linalg.norm(c, axis=-1, keepdims=True)
    for bt in range(batch):
        for i in range(agents):
            for j in range(agents):
                expected = 0.25 * (2 + hn[bt, i] @ hn[bt, j] + cn[bt, i] @ cn[bt, j])
                assert e[bt, i, j] == pytest.approx(expected, abs=1e-9)
    np.testing.assert_allclose(e, np.swapaxes(e, -1, -2), atol=1e-12)
    assert ((e >= 0) & (e <= 1)).all()


def test_types_and_dtypes_round_trip():
    rng = np.random.default_rng(0)
    h32, c32 = _unit(rng, 2, 3, 8).astype(np.float32), _unit(rng, 2, 3, 8).astype(np.float32)
    e_np = pairwise_evidence(h32, c32)
    assert isinstance(e_np, np.ndarray) and e_np.dtype == np.float32
    e_t = pairwise_evidence(torch.from_numpy(h32), torch.from_numpy(c32))
    assert isinstance(e_t, torch.Tensor) and e_t.dtype == torch.float32
    np.testing.assert_allclose(e_t.numpy(), e_np, atol=1e-7)
    e64 = pairwise_evidence(h32.astype(np.float64), c32.astype(np.float64))
    assert e64.dtype == np.float64
    np.testing.assert_allclose(e64, e_np, atol=1e-6)


def test_clamped_even_for_rounding():
    # Many copies of the same vector: rounding may give cos slightly > 1; e must still be <= 1.
    v = np.full((1, 5, 384), 0.05, dtype=np.float32)
    e = pairwise_evidence(v, v)
    assert e.max() <= 1.0 and e.min() >= 0.0


@pytest.mark.parametrize(
    "h, c, message",
    [
        (np.ones((1, 1, 4)), np.ones((1, 1, 4)), "V >= 2"),
        (np.ones((1, 3, 4)), np.ones((1, 3, 5)), "shapes differ"),
        (np.ones((3, 4)), np.ones((3, 4)), r"shape \(B, V, d\)"),
        (np.array([[[1.0, np.nan], [1.0, 0.0]]]), np.ones((1, 2, 2)), r"h\[0, 0\] contains NaN or inf"),
        (np.ones((1, 2, 2)), np.array([[[1.0, 0.0], [np.inf, 0.0]]]), r"c\[0, 1\] contains NaN or inf"),
        (np.array([[[1.0, 0.0], [0.0, 0.0]]]), np.ones((1, 2, 2)), r"h\[0, 1\] is a zero-norm vector"),
        (np.ones((0, 2, 2)), np.ones((0, 2, 2)), "empty axis"),
        (np.ones((1, 2, 2)), torch.ones(1, 2, 2), "both be torch tensors or both numpy"),
    ],
)
def test_bad_input(h, c, message):
    with pytest.raises(ValueError, match=message):
        pairwise_evidence(h, c)


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.float32, (2, 3, 6), elements=st.floats(-1, 1, width=32)))
def test_random_arrays_never_crash_unexpectedly(h):
    """Arbitrary finite input either works (e in [0, 1]) or is rejected for a zero-norm row."""
    try:
        e = pairwise_evidence(h, h)
    except ValueError as exc:
        assert "zero-norm" in str(exc)
    else:
        assert np.isfinite(e).all() and ((e >= 0) & (e <= 1)).all()


def test_text_to_fused_beliefs_pipeline():
    """Hashing encoder -> evidence -> opinions -> fusion on real text: the odd one out is most uncertain."""
    encoder = make_encoder("hashing")
    reasoning = [
        "Tom has 3 apples and buys 2 more so he has 5 apples",
        "Tom has 3 apples, buys 2 more apples, so 5 apples in total",
        "The train leaves at noon and travels 60 miles per hour for 2 hours",
    ]
    conclusions = ["The answer is 5", "The answer is 5", "The answer is 120"]
    h = encoder.encode(reasoning)[None]
    c = encoder.encode(conclusions)[None]
    e = pairwise_evidence(torch.from_numpy(h), torch.from_numpy(c))
    op = opinions(e)
    assert torch.argmax(op.u[0]).item() == 2
    fused = fuse(op, ~torch.eye(3, dtype=torch.bool)[None])
    assert fused.u[0, 0] < op.u[0, 0]  # reading an agreeing peer makes agent 0 more certain
