"""Subjective logic and Dempster-Shafer fusion: paper example, invariants, algebra, reference, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dear.belief import Combined, Fused, Opinion, combine, fuse, opinions
from tests.dear.belief.reference import RefOpinion, ref_combine, ref_fuse, ref_opinions

PAPER_E = torch.tensor([[[1.0, 0.92, 0.21], [0.92, 1.0, 0.18], [0.21, 0.18, 1.0]]], dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------------------------

unit = st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def evidence_and_mask(draw, max_batch: int = 4, max_agents: int = 6):
    batch = draw(st.integers(1, max_batch))
    agents = draw(st.integers(2, max_agents))
    e = draw(hnp.arrays(np.float64, (batch, agents, agents), elements=unit))
    mask = draw(hnp.arrays(np.bool_, (batch, agents, agents)))
    mask[:, np.arange(agents), np.arange(agents)] = False
    return e, mask


@st.composite
def mass(draw, agents: int, min_u: float = 0.05):
    """A general opinion (b (V,), u) with masses summing to 1 and u >= min_u (away from total conflict)."""
    weights = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=agents, max_size=agents)))
    u = draw(st.floats(min_u, 1.0))
    b = weights / weights.sum() * (1.0 - u) if weights.sum() > 0 else np.zeros(agents)
    if weights.sum() == 0:
        u = 1.0
    return torch.tensor(b, dtype=torch.float64), torch.tensor(u, dtype=torch.float64)


def _close(a: torch.Tensor, b, atol: float = 1e-9) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), atol=atol, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# subjective logic
# ---------------------------------------------------------------------------------------------------------


def test_paper_worked_example():
    op = opinions(PAPER_E)
    # Agent 3 (index 2) is isolated and the most uncertain: u_3 = 3 / (3 + 0.21 + 0.18) = 3 / 3.39.
    assert op.u[0, 2].item() == pytest.approx(3 / 3.39, abs=1e-12)
    assert op.u[0, 2].item() == pytest.approx(0.885, abs=5e-4)
    assert op.u[0, 0].item() == pytest.approx(3 / (3 + 0.92 + 0.21))
    assert op.b[0, 2, 0].item() == pytest.approx(0.21 / 3.39)
    assert torch.argmax(op.u[0]).item() == 2
    assert torch.all(torch.diagonal(op.b, dim1=-2, dim2=-1) == 0)


def test_self_evidence_is_excluded():
    e = PAPER_E.clone()
    e[0, 0, 0] = 0.0  # the diagonal must not matter
    op_a, op_b = opinions(PAPER_E), opinions(e)
    assert torch.equal(op_a.b, op_b.b) and torch.equal(op_a.u, op_b.u)


@settings(max_examples=80, deadline=None)
@given(evidence_and_mask())
def test_opinion_invariants_and_reference(sample):
    e, _ = sample
    op = opinions(torch.from_numpy(e))
    total = op.b.sum(-1) + op.u
    _close(total, np.ones_like(total), atol=1e-12)
    assert bool(((op.b >= 0) & (op.b <= 1)).all()) and bool(((op.u > 0) & (op.u <= 1)).all())
    ref = ref_opinions(e)
    _close(op.b, ref.b, atol=1e-6)
    _close(op.u, ref.u, atol=1e-6)
    # float32 input also agrees with the float64 reference
    op32 = opinions(torch.from_numpy(e).float())
    assert op32.b.dtype == torch.float32
    _close(op32.b, ref.b, atol=1e-6)
    _close(op32.u, ref.u, atol=1e-6)


def test_opinions_accepts_numpy():
    op = opinions(PAPER_E.numpy())
    assert isinstance(op.b, torch.Tensor) and op.u[0, 2].item() == pytest.approx(3 / 3.39)


# ---------------------------------------------------------------------------------------------------------
# Dempster's rule: algebra
# ---------------------------------------------------------------------------------------------------------


def _assert_same(x: Combined, y: Combined, atol: float = 1e-9) -> None:
    _close(x.b, y.b, atol)
    _close(x.u, y.u, atol)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 6).flatmap(lambda v: st.tuples(mass(v), mass(v), mass(v))))
def test_combine_commutative_associative_and_valid(masses):
    (b1, u1), (b2, u2), (b3, u3) = masses
    m12 = combine(b1, u1, b2, u2)
    _assert_same(m12, combine(b2, u2, b1, u1))
    left = combine(m12.b, m12.u, b3, u3)
    m23 = combine(b2, u2, b3, u3)
    right = combine(b1, u1, m23.b, m23.u)
    _assert_same(left, right, atol=1e-9)
    for m in (m12, left):
        assert bool(torch.isfinite(m.b).all()) and bool(torch.isfinite(m.u))
        assert m.b.sum().item() + m.u.item() == pytest.approx(1.0, abs=1e-12)
        assert bool((m.b >= 0).all()) and 0 <= m.u.item() <= 1
    ref = ref_combine(b1.numpy(), u1.item(), b2.numpy(), u2.item())
    _close(m12.b, ref.b, atol=1e-9)
    assert m12.u.item() == pytest.approx(ref.u, abs=1e-9)
    assert m12.conflict.item() == pytest.approx(ref.conflict, abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 6).flatmap(lambda v: mass(v, min_u=0.0)))
def test_vacuous_opinion_is_identity(m):
    b, u = m
    vac_b, vac_u = torch.zeros_like(b), torch.tensor(1.0, dtype=b.dtype)
    for out in (combine(b, u, vac_b, vac_u), combine(vac_b, vac_u, b, u)):
        _close(out.b, b, atol=1e-12)
        assert out.u.item() == pytest.approx(u.item(), abs=1e-12)
        assert out.conflict.item() == 0.0


def test_vacuous_peer_leaves_fused_opinion_unchanged():
    op = opinions(PAPER_E)
    # Replace agent 2's opinion by the vacuous one; agent 0 reading 1 and 2 == agent 0 reading 1 only.
    b, u = op.b.clone(), op.u.clone()
    b[0, 2], u[0, 2] = 0.0, 1.0
    vac = Opinion(b=b, u=u)
    with_vac = fuse(vac, torch.tensor([[[False, True, True], [False] * 3, [False] * 3]]))
    without = fuse(vac, torch.tensor([[[False, True, False], [False] * 3, [False] * 3]]))
    _close(with_vac.b[0, 0], without.b[0, 0], atol=1e-12)
    _close(with_vac.u[0, 0], without.u[0, 0], atol=1e-12)
    _close(with_vac.conflict[0, 0], without.conflict[0, 0], atol=1e-12)


def test_total_conflict_is_finite_and_documented_yager_rule():
    # Two dogmatic agents (u = 0) on different answers: 1 - C = 0, Dempster's rule is undefined.
    b1 = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    b2 = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    zero = torch.tensor(0.0, dtype=torch.float64)
    out = combine(b1, zero, b2, zero)
    assert out.conflict.item() == 1.0
    # Yager: all the conflict goes to the whole frame -> total ignorance, still a valid mass function.
    assert out.u.item() == 1.0 and torch.all(out.b == 0)
    ref = ref_combine(b1.numpy(), 0.0, b2.numpy(), 0.0)
    assert ref.u == 1.0 and np.all(ref.b == 0)

    # Nearly total conflict in float32 stays finite and sums to 1.
    eps = 1e-9
    near = combine(torch.tensor([1 - eps, 0.0]), torch.tensor(eps), torch.tensor([0.0, 1 - eps]), torch.tensor(eps))
    assert bool(torch.isfinite(near.b).all()) and bool(torch.isfinite(near.u))
    assert near.b.sum().item() + near.u.item() == pytest.approx(1.0, abs=1e-6)

    # Through fuse: three dogmatic agents, each on its own answer, all reading each other.
    op = Opinion(b=torch.eye(3, dtype=torch.float64)[None].clone(), u=torch.zeros(1, 3, dtype=torch.float64))
    full = ~torch.eye(3, dtype=torch.bool)[None]
    for rule in ("dst", "mean"):
        fused = fuse(op, full, rule=rule)
        for x in (fused.b, fused.u, fused.conflict, fused.evidence):
            assert bool(torch.isfinite(x).all()), rule
        _close(fused.b.sum(-1) + fused.u, np.ones((1, 3)), atol=1e-12)
        _close(fused.conflict, np.full((1, 3), 1.0 if rule == "dst" else 0.0), atol=1e-12)  # mean: no DST conflict
    ref = ref_fuse(RefOpinion(b=op.b.numpy(), u=op.u.numpy()), full.numpy())
    _close(fuse(op, full).u, ref.u, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# fuse: reference agreement, peer order, empty mask, mean rule
# ---------------------------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(evidence_and_mask(), st.sampled_from(["dst", "mean"]))
def test_fuse_matches_numpy_reference(sample, rule):
    e, mask = sample
    ref = ref_fuse(ref_opinions(e), mask, rule=rule)
    for dtype, atol in ((torch.float64, 1e-6), (torch.float32, 1e-5)):
        fused = fuse(opinions(torch.from_numpy(e).to(dtype)), torch.from_numpy(mask), rule=rule)
        assert isinstance(fused, Fused) and fused.b.dtype == dtype
        _close(fused.b, ref.b, atol)
        _close(fused.u, ref.u, atol)
        _close(fused.conflict, ref.conflict, atol)
        np.testing.assert_allclose(fused.evidence.double().numpy(), ref.evidence, rtol=atol, atol=atol)
    fused = fuse(opinions(torch.from_numpy(e)), torch.from_numpy(mask), rule=rule)
    _close(fused.b.sum(-1) + fused.u, np.ones(fused.u.shape), atol=1e-12)
    assert bool(((fused.b >= 0) & (fused.b <= 1)).all()) and bool(((fused.u >= 0) & (fused.u <= 1)).all())
    assert bool(((fused.conflict >= 0) & (fused.conflict <= 1)).all())


@settings(max_examples=60, deadline=None)
@given(evidence_and_mask(), st.randoms(use_true_random=False), st.sampled_from(["dst", "mean"]))
def test_peer_order_never_matters(sample, rnd, rule):
    """Relabelling the agents changes the fold order; results must just be relabelled too."""
    e, mask = sample
    agents = e.shape[-1]
    perm = list(range(agents))
    rnd.shuffle(perm)
    p = torch.tensor(perm)
    op = opinions(torch.from_numpy(e))
    base = fuse(op, torch.from_numpy(mask), rule=rule)
    op_p = Opinion(b=op.b[:, p][:, :, p], u=op.u[:, p])
    permuted = fuse(op_p, torch.from_numpy(mask)[:, p][:, :, p], rule=rule)
    _close(permuted.b, base.b[:, p][:, :, p], atol=1e-9)
    _close(permuted.u, base.u[:, p], atol=1e-9)
    _close(permuted.conflict, base.conflict[:, p], atol=1e-9)


def test_fold_in_reverse_peer_order_by_hand():
    e = torch.rand(2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    op = opinions(e)
    mask = ~torch.eye(5, dtype=torch.bool).expand(2, 5, 5)
    fused = fuse(op, mask)
    for bt in range(2):
        for i in range(5):
            b, u, kept = op.b[bt, i], op.u[bt, i], 1.0
            for j in reversed([j for j in range(5) if j != i]):
                step = combine(b, u, op.b[bt, j], op.u[bt, j])
                b, u, kept = step.b, step.u, kept * (1 - step.conflict.item())
            _close(fused.b[bt, i], b, atol=1e-12)
            assert fused.u[bt, i].item() == pytest.approx(u.item(), abs=1e-12)
            assert fused.conflict[bt, i].item() == pytest.approx(1 - kept, abs=1e-12)


@pytest.mark.parametrize("rule", ["dst", "mean"])
def test_empty_mask_leaves_own_opinion(rule):
    e = torch.rand(4, 3, 3, generator=torch.Generator().manual_seed(1))
    op = opinions(e)
    fused = fuse(op, torch.zeros(4, 3, 3, dtype=torch.bool), rule=rule)
    assert torch.equal(fused.b, op.b) and torch.equal(fused.u, op.u)
    assert torch.all(fused.conflict == 0)
    _close(fused.evidence, op.b * (3 / op.u).unsqueeze(-1), atol=1e-6)
    # The fused evidence of an unfused opinion is the agent's raw evidence about its peers (off-diagonal).
    off = e.masked_fill(torch.eye(3, dtype=torch.bool), 0)
    _close(fused.evidence, off, atol=1e-5)


def test_mean_rule_is_plain_mean_and_differs_from_dst():
    op = opinions(PAPER_E)
    mask = torch.tensor([[[False, True, True], [True, False, False], [False, False, False]]])
    mean = fuse(op, mask, rule="mean")
    _close(mean.b[0, 0], (op.b[0, 0] + op.b[0, 1] + op.b[0, 2]) / 3, atol=1e-12)
    _close(mean.u[0, 1], (op.u[0, 1] + op.u[0, 0]) / 2, atol=1e-12)
    dst = fuse(op, mask, rule="dst")
    assert not torch.allclose(mean.u, dst.u)
    # The ablation carries no DST quantity: its conflict entry is 0 where DST reports a real conflict.
    assert torch.all(mean.conflict == 0)
    assert bool((dst.conflict[0, :2] > 0).all())
    # DST sharpens agreement: agent 0 reading its ally 1 becomes more certain than under the mean.
    assert dst.u[0, 1] < mean.u[0, 1]


def test_fuse_is_deterministic_and_batched_rows_independent():
    gen = torch.Generator().manual_seed(2)
    e = torch.rand(8, 4, 4, generator=gen)
    mask = torch.rand(8, 4, 4, generator=gen) < 0.5
    mask &= ~torch.eye(4, dtype=torch.bool)
    op = opinions(e)
    first, second = fuse(op, mask), fuse(op, mask)
    assert torch.equal(first.b, second.b) and torch.equal(first.conflict, second.conflict)
    single = fuse(opinions(e[3:4]), mask[3:4])
    _close(single.b[0], first.b[3], atol=1e-6)


def test_fuse_accepts_integer_mask():
    op = opinions(PAPER_E)
    as_int = torch.tensor([[[0, 1, 0], [1, 0, 1], [0, 0, 0]]])
    assert torch.equal(fuse(op, as_int).b, fuse(op, as_int.bool()).b)


# ---------------------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "e, message",
    [
        (torch.full((1, 1, 1), 0.5), "V >= 2"),
        (torch.full((1, 3, 2), 0.5), r"shape \(B, V, V\)"),
        (torch.full((3, 3), 0.5), r"shape \(B, V, V\)"),
        (torch.tensor([[[1.0, float("nan")], [0.2, 1.0]]]), r"evidence\[0, 0, 1\] is NaN or inf"),
        (torch.tensor([[[1.0, 0.3], [float("inf"), 1.0]]]), r"evidence\[0, 1, 0\] is NaN or inf"),
        (torch.tensor([[[1.0, 1.5], [0.2, 1.0]]]), r"outside \[0, 1\]"),
        (torch.tensor([[[1.0, -0.1], [0.2, 1.0]]]), r"outside \[0, 1\]"),
        (torch.zeros(0, 3, 3), "empty batch"),
    ],
)
def test_opinions_bad_input(e, message):
    with pytest.raises(ValueError, match=message):
        opinions(e)


def test_fuse_bad_input():
    op = opinions(PAPER_E)
    with pytest.raises(ValueError, match="self-loop"):
        fuse(op, torch.eye(3, dtype=torch.bool)[None])
    with pytest.raises(ValueError, match=r"mask must have shape \(B, V, V\) = \(1, 3, 3\)"):
        fuse(op, torch.zeros(1, 3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask must have shape"):
        fuse(op, torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="only 0/1"):
        fuse(op, torch.full((1, 3, 3), 2))
    with pytest.raises(ValueError, match="unknown fusion rule 'max'"):
        fuse(op, torch.zeros(1, 3, 3, dtype=torch.bool), rule="max")
    with pytest.raises(ValueError, match=r"opinion.u must have shape"):
        fuse(Opinion(b=op.b, u=op.u[:, :2]), torch.zeros(1, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="summing to"):
        fuse(Opinion(b=op.b, u=op.u * 0.5), torch.zeros(1, 3, 3, dtype=torch.bool))
    bad = op.b.clone()
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"opinion.b\[0, 1, 2\] is NaN or inf"):
        fuse(Opinion(b=bad, u=op.u), torch.zeros(1, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="takes an Opinion"):
        fuse((op.b, op.u), torch.zeros(1, 3, 3, dtype=torch.bool))
