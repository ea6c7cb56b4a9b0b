"""Maximum-likelihood fit of every dynamics parameter of the simulator (`dear.sim`) to logged debates, no priors:
round 0 and transitions jointly (`dear.sim.likelihood`, each question's difficulty integrated out), the
wrong-answer concentration from how round-0 wrong answers coincide, completion length and token counters; with
an identification report and an optional ridge penalty (its strength chosen by cross-validation in
`simworld.fit`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import minimize

from dear.metrics import Ratio
from dear.sim.likelihood import FitData, likelihood_parts
from dear.sim.model import kappa_of, sigmoid, wrong_label_probs
from dear.sim.params import SimParams
from dear.sim.records import DebateRecord, transitions
from dear.sim.text import TEXT_OVERHEAD_TOKENS

# Every dynamics parameter is estimated from the data alone. Conventions that are not estimates (any value gives
# the same likelihood after re-parametrisation) are listed in MLE_CONVENTIONS and reported as such.
MLE_CONVENTIONS = {
    "t_ref": "reference temperature T0 of the excess x: shifts into the intercepts (c, a0, s0), not identifiable",
    "top_p_ref": "reference top-p P0 of the excess x: shifts into the intercepts, not identifiable",
    "skills (mean)": "the mean skill is absorbed in the difficulty centre c; skills are reported with mean 0",
}
_BOUND = 12.0  # |logit-scale parameters| (a logistic term beyond ±12 is a probability within 6e-6 of 0 or 1)


@dataclass(frozen=True)
class MLEParam:
    """One estimated parameter on its optimisation scale, with its bounds."""

    name: str
    lo: float
    hi: float


def _mle_layout(V: int, fit_top_p: bool) -> list[MLEParam]:
    """The estimated parameters on their optimisation scale (logs, logits, V − 1 free skills), with bounds."""
    names = ["difficulty_center", "log_difficulty_scale", "temp_penalty"] + (["top_p_weight"] if fit_top_p else [])
    names += [f"skill_{a}" for a in range(V - 1)]
    names += ["switch_bias", "switch_disagree", "switch_agree", "switch_temp", "self_revise_bias",
              "self_revise_temp", "logit_p_resolve", "resolve_bonus"]
    bounds = {"log_difficulty_scale": (-3.0, 3.0), "top_p_weight": (-5.0, 5.0)}
    return [MLEParam(n, *bounds.get(n, (-_BOUND, _BOUND))) for n in names]


def _theta_to_params(th: np.ndarray, layout: Sequence[MLEParam], base: SimParams, V: int) -> SimParams:
    """The SimParams of a point θ of the layout (the last skill makes the skills' sum 0), other fields from `base`."""
    v = dict(zip((q.name for q in layout), th.tolist()))
    skills = [v[f"skill_{a}"] for a in range(V - 1)]
    skills.append(-sum(skills))
    return replace(
        base, difficulty_center=v["difficulty_center"], difficulty_scale=math.exp(v["log_difficulty_scale"]),
        temp_penalty=v["temp_penalty"], top_p_weight=v.get("top_p_weight", base.top_p_weight), skills=skills,
        switch_bias=v["switch_bias"], switch_disagree=v["switch_disagree"], switch_agree=v["switch_agree"],
        switch_temp=v["switch_temp"], self_revise_bias=v["self_revise_bias"], self_revise_temp=v["self_revise_temp"],
        p_resolve=float(sigmoid(v["logit_p_resolve"])), resolve_bonus=v["resolve_bonus"],
    )


def _params_to_theta(p: SimParams, layout: Sequence[MLEParam], V: int) -> np.ndarray:
    """The point θ of `p` on the layout (skills centred, values clipped to the bounds)."""
    skills = [p.skill(a) for a in range(V)]
    mean = float(np.mean(skills))
    v = {"difficulty_center": p.difficulty_center - mean, "log_difficulty_scale": math.log(p.difficulty_scale),
         "temp_penalty": p.temp_penalty, "top_p_weight": p.top_p_weight,
         **{f"skill_{a}": skills[a] - mean for a in range(V - 1)},
         "switch_bias": p.switch_bias, "switch_disagree": p.switch_disagree, "switch_agree": p.switch_agree,
         "switch_temp": p.switch_temp, "self_revise_bias": p.self_revise_bias, "self_revise_temp": p.self_revise_temp,
         "logit_p_resolve": float(np.clip(logit_scalar(p.p_resolve), -_BOUND, _BOUND)),
         "resolve_bonus": p.resolve_bonus}
    return np.array([float(np.clip(v[q.name], q.lo, q.hi)) for q in layout])


def logit_scalar(x: float) -> float:
    """log(x / (1 − x)) of one number, x clipped to [1e-6, 1 − 1e-6]."""
    x = min(max(float(x), 1e-6), 1 - 1e-6)
    return math.log(x / (1 - x))



def wrong_pair_agreement(records: Sequence[DebateRecord]) -> Ratio:
    """How often two wrong round-0 answers to the same question are the same answer (no-answer = unique)."""
    return wrong_pairs_same(round0_wrong_answers(records))


def round0_wrong_answers(records: Sequence[DebateRecord]) -> list[list[str | None]]:
    """Per record: the answers of its wrong round-0 turns (None = no answer)."""
    return [[t.answer for t in rec.rounds[0] if not t.correct] for rec in records]


def wrong_pairs_same(wrong_answers: Sequence[Sequence[str | None]]) -> Ratio:
    """Over every question's pairs of wrong answers: how many are the same answer (a missing answer is unique)."""
    k = n = 0
    for wrong in wrong_answers:
        for i in range(len(wrong)):
            for j in range(i + 1, len(wrong)):
                n += 1
                k += wrong[i] is not None and wrong[i] == wrong[j]
    return Ratio(k, n)


def wrong_signatures(wrong_answers: Sequence[Sequence[str | None]]) -> list[tuple[int, ...]]:
    """Per question with at least two wrong answers: the block sizes of its wrong answers grouped by equal answer
    (None = its own block), largest first."""
    out = []
    for wrong in wrong_answers:
        if len(wrong) < 2:
            continue
        counts = Counter(a for a in wrong if a is not None)
        out.append(tuple(sorted(list(counts.values()) + [1] * sum(a is None for a in wrong), reverse=True)))
    return out


def _signature_probs(u: float, lam: float, m: int) -> dict[tuple[int, ...], float]:
    """P(block sizes) of m independent wrong draws: unique w.p. u, else distractor i w.p. softmax(−λ·i)."""
    return signature_probs(wrong_label_probs(replace(SimParams(), p_unique_wrong=u, distractor_decay=lam)), m)


def signature_probs(probs: np.ndarray, m: int) -> dict[tuple[int, ...], float]:
    """P(block sizes) of m independent draws over labels with probabilities `probs` (label 0: each draw its own
    block). Sums the multinomial over how many draws land on each label (C(m + L − 1, L − 1) terms, not L^m)."""
    out: dict[tuple[int, ...], float] = {}
    for counts in _compositions(m, len(probs)):
        ways = math.factorial(m) / math.prod(math.factorial(c) for c in counts)
        sig = tuple(sorted([c for c in counts[1:] if c > 0] + [1] * counts[0], reverse=True))
        out[sig] = out.get(sig, 0.0) + ways * float(np.prod(probs ** np.array(counts)))
    return out


def _compositions(m: int, parts: int) -> list[tuple[int, ...]]:
    """Every tuple of `parts` non-negative integers summing to m."""
    if parts == 1:
        return [(m,)]
    return [(first, *rest) for first in range(m + 1) for rest in _compositions(m - first, parts - 1)]


def fit_wrong_answers(records: Sequence[DebateRecord], base: SimParams) -> tuple[SimParams, dict[str, Any]]:
    """u (p_unique_wrong) and λ (distractor_decay) from the records' round-0 wrong answers (`fit_wrong_signatures`)."""
    return fit_wrong_signatures(round0_wrong_answers(records), base)


def fit_wrong_signatures(wrong_answers: Sequence[Sequence[str | None]], base: SimParams
                         ) -> tuple[SimParams, dict[str, Any]]:
    """u (p_unique_wrong) and λ (distractor_decay) by maximum likelihood of how each question's wrong answers coincide
    (pairs and triples and beyond). Pairs alone identify only κ = (1 − u)²·Σw²; larger groups separate u and λ."""
    sigs = wrong_signatures(wrong_answers)
    agreement = wrong_pairs_same(wrong_answers)
    info: dict[str, Any] = {"wrong_pair_agreement": [agreement.num, agreement.den], "wrong_answer_questions": len(sigs)}
    if not sigs:
        info.update(kappa=None, wrong_answers_identified=False)
        return base, info
    sig_counts = Counter(sigs)

    def nll(th: np.ndarray) -> float:
        u, lam = float(sigmoid(th[0])), float(math.exp(th[1]))
        by_m = {m: _signature_probs(u, lam, m) for m in {sum(sig) for sig in sig_counts}}
        total = 0.0
        for sig, c in sig_counts.items():
            total -= c * math.log(max(by_m[sum(sig)].get(sig, 0.0), 1e-300))
        return total

    res = minimize(nll, np.array([logit_scalar(0.1), math.log(1.5)]), method="L-BFGS-B",
                   bounds=[(-_BOUND, _BOUND), (-4.0, 3.5)])
    u, lam = float(sigmoid(res.x[0])), float(math.exp(res.x[1]))
    p = replace(base, p_unique_wrong=u, distractor_decay=lam)
    H = _numeric_hessian(nll, res.x)
    se = None
    if np.linalg.eigvalsh(H).min() > 1e-8:
        se = np.sqrt(np.diag(np.linalg.inv(H))).tolist()
    at_bound = [abs(res.x[0]) > _BOUND - 1e-3, res.x[1] < -4 + 1e-3 or res.x[1] > 3.5 - 1e-3]
    ok = se is not None and not any(at_bound) and max(se) <= SE_LIMIT
    info.update(kappa=kappa_of(p), logit_u=float(res.x[0]), log_lambda=float(res.x[1]), se=se,
                wrong_answers_identified=bool(ok), questions_with_3_wrong=sum(sum(sig) >= 3 for sig in sigs))
    return p, info


def fit_words(records_turns: Sequence[tuple[float, int, bool]]) -> dict[str, Any]:
    """words_base, words_per_temp: least squares (the Gaussian MLE) of completion tokens on temperature over the
    turns that were not cut at max_tokens; `records_turns` = (temperature, completion tokens, cut). The sim needs
    words_per_temp >= 0: a negative slope is refitted under that bound (slope 0, base = the mean, the constrained
    MLE), marked `slope_at_bound`, with the unconstrained slope kept as `unconstrained_per_temp`."""
    rows = [(t, n) for t, n, cut in records_turns if not cut]
    if len(rows) < 3 or float(np.ptp([t for t, _ in rows])) < 1e-6:
        return {"identified": False, "n": len(rows)}
    T = np.array([t for t, _ in rows])
    y = np.array([n for _, n in rows], dtype=float) - TEXT_OVERHEAD_TOKENS
    X = np.stack([np.ones_like(T), T], 1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    cov = np.linalg.inv(X.T @ X) * float(resid.var(ddof=2))
    out = {"identified": True, "n": len(rows), "words_base": float(coef[0]), "words_per_temp": float(coef[1]),
           "se": [float(math.sqrt(cov[0, 0])), float(math.sqrt(cov[1, 1]))], "resid_sd": float(resid.std(ddof=2))}
    if coef[1] < 0:
        resid = y - y.mean()
        out.update(words_base=float(y.mean()), words_per_temp=0.0, slope_at_bound=True,
                   unconstrained_per_temp=float(coef[1]), se_unconstrained=out["se"],
                   se=[float(resid.std(ddof=1) / math.sqrt(len(y))), None], resid_sd=float(resid.std(ddof=1)))
    return out


def fit_chars_per_token(turns: Sequence[dict]) -> dict[str, float]:
    """The sim's token counters from real turns (ratios of sums, the MLE of a constant rate): prompt characters
    (all messages) per prompt token, and completion characters per completion token."""
    ok = [t for t in turns if t.get("error") is None and t.get("prompt_tokens") and t.get("completion_tokens")]
    if not ok:
        return {"identified": False, "n": 0}
    prompt_chars = sum(len(m["content"]) for t in ok for m in t["messages"])
    text_chars = sum(len(t["text"]) for t in ok)
    return {"identified": True, "n": len(ok),
            "prompt_chars_per_token": prompt_chars / sum(int(t["prompt_tokens"]) for t in ok),
            "text_chars_per_token": text_chars / sum(int(t["completion_tokens"]) for t in ok)}


def _numeric_hessian(f, th: np.ndarray, h: float = 1e-3) -> np.ndarray:
    """The Hessian of f at θ by central differences of step h."""
    n = len(th)
    H = np.zeros((n, n))
    f0 = f(th)
    for i in range(n):
        ei = np.zeros(n)
        ei[i] = h
        H[i, i] = (f(th + ei) - 2 * f0 + f(th - ei)) / h**2
        for j in range(i + 1, n):
            ej = np.zeros(n)
            ej[j] = h
            H[i, j] = H[j, i] = (f(th + ei + ej) - f(th + ei - ej) - f(th - ei + ej) + f(th - ei - ej)) / (4 * h * h)
    return H


def _standard_errors(H: np.ndarray, names: Sequence[str]) -> dict[str, float | None]:
    """sqrt(diag(H⁻¹)) per parameter; all None when H is singular or not positive definite."""
    try:
        evals = np.linalg.eigvalsh(H)
        if evals.min() > 1e-8 * max(1.0, evals.max()):
            cov = np.linalg.inv(H)
            return {n: float(math.sqrt(max(cov[k, k], 0.0))) for k, n in enumerate(names)}
    except np.linalg.LinAlgError:
        pass
    return {n: None for n in names}


@dataclass
class MLEFit:
    """A maximum-likelihood fit: the SimParams and, per estimated parameter, estimate, s.e. and identification."""

    params: SimParams
    estimates: dict[str, float]  # on the optimisation scale (logs / logits as named)
    se: dict[str, float | None]  # standard errors from the observed information (None: not invertible)
    identified: dict[str, bool]
    why_not: dict[str, str]
    info: dict[str, Any]


SE_LIMIT = 5.0  # an estimate whose standard error exceeds this (on its logit / log scale) is not identified


# The transition law's parameters (on the optimisation scale) that `ridge` shrinks towards 0 = "no effect" / even
# odds. Round 0 (difficulty, skills) is identified by every question and is never penalised.
PENALISED = frozenset({"temp_penalty", "top_p_weight", "switch_bias", "switch_disagree", "switch_agree",
                       "switch_temp", "self_revise_bias", "self_revise_temp", "logit_p_resolve", "resolve_bonus"})


def fit_mle(records: Sequence[DebateRecord], init: SimParams | None = None, ridge: float = 0.0,
            standard_errors: bool = True) -> MLEFit:
    """Joint maximum likelihood of every dynamics parameter (round 0 and transitions, question difficulty
    integrated out per question), no priors. `init` is only the optimiser's start. Identification: a parameter
    is reported not identified when the data do not vary what it multiplies (e.g. top-p constant), when its
    estimate sits at a bound (the likelihood keeps rising towards 0/1 probabilities), or when its standard error
    from the observed information matrix exceeds SE_LIMIT (or the matrix is singular in its direction).

    `ridge` = λ > 0 maximises the penalised likelihood log L − λ/2 · Σ θ² over the PENALISED parameters instead
    (λ = 0 is plain ML): rare flips let plain ML push a logit to its bound, i.e. call an unseen event impossible,
    which costs ~20 nats each time it happens out of sample. Choose λ by cross-validation (simworld.fit), not by
    hand. Standard errors then come from the penalised objective's curvature; `standard_errors=False` skips them
    (the numeric Hessian is a third of a fit's time)."""
    if ridge < 0:
        raise ValueError(f"fit_mle: ridge must be >= 0, got {ridge}")
    if not records:
        raise ValueError("fit_mle: no debates")
    V = max(rec.n_agents for rec in records)
    init = SimParams.from_dict({**(init or SimParams()).to_dict(), "skills": [(init or SimParams()).skill(a)
                                                                             for a in range(V)]})
    p_wrong, wrong_info = fit_wrong_answers(records, init)
    kappa = kappa_of(p_wrong)
    trs = transitions(records)
    top_ps = [t.top_p for rec in records for turns in rec.rounds for t in turns]
    temps_ex = [t.temperature for t in trs]
    fit_top_p = float(np.ptp(top_ps)) > 1e-6
    layout = _mle_layout(V, fit_top_p)
    base = replace(init, p_unique_wrong=p_wrong.p_unique_wrong, distractor_decay=p_wrong.distractor_decay)
    th0 = _params_to_theta(base, layout, V)

    data = FitData.of(records)
    penalised = np.array([q.name in PENALISED for q in layout])

    def nll(th: np.ndarray) -> float:
        penalty = 0.5 * ridge * float((th[penalised] ** 2).sum()) if ridge else 0.0
        return -float(likelihood_parts(_theta_to_params(th, layout, base, V), data, kappa).joint.sum()) + penalty

    res = minimize(nll, th0, method="L-BFGS-B", bounds=[(q.lo, q.hi) for q in layout])
    th = res.x
    names = [q.name for q in layout]
    se: dict[str, float | None] = {n: None for n in names}
    if standard_errors:
        se = _standard_errors(_numeric_hessian(nll, th), names)
    why: dict[str, str] = {}
    for k, q in enumerate(layout):
        if min(th[k] - q.lo, q.hi - th[k]) < 1e-3:
            why[q.name] = f"at the bound {q.lo if th[k] - q.lo < 1e-3 else q.hi} (likelihood rises towards it)"
        elif not standard_errors:
            continue  # no curvature computed: only the bound test applies
        elif se[q.name] is None:
            why[q.name] = "observed information singular in its direction"
        elif se[q.name] > SE_LIMIT:
            why[q.name] = f"standard error {se[q.name]:.1f} > {SE_LIMIT}"
    n_read0 = sum(t.n_read == 0 and t.own is not None for t in trs)
    n_dis = sum(t.n_dis > 0 and t.own is not None for t in trs)
    if n_read0 == 0:
        for n in ("self_revise_bias", "self_revise_temp"):
            why[n] = "no transition with an empty mask"
    if n_dis == 0:
        for n in ("switch_disagree", "logit_p_resolve"):
            why[n] = "no transition reading a disagreeing peer"
    if float(np.ptp(temps_ex)) < 1e-6 if temps_ex else True:
        for n in ("switch_temp", "self_revise_temp"):
            why[n] = "exchange-round temperature never varied"
    if not fit_top_p:
        why["top_p_weight"] = "top-p never varied (kept at the optimiser's start value)"
    if not wrong_info["wrong_answers_identified"]:
        why["p_unique_wrong / distractor_decay"] = (
            f"wrong-answer coincidences do not pin them down ({wrong_info.get('wrong_answer_questions', 0)} questions "
            f"with >= 2 wrong round-0 answers, s.e. {wrong_info.get('se')}); kept at the optimiser's end point")
    identified = {n: n not in why for n in names}
    fitted = _theta_to_params(th, layout, base, V)
    info = {"converged": bool(res.success), "message": str(res.message), "nll": float(res.fun), "ridge": ridge,
            "n_debates": len(records), "n_transitions": len(trs), "kappa": kappa, **wrong_info,
            "conventions": MLE_CONVENTIONS, "not_identified": why}
    return MLEFit(fitted, dict(zip(names, th.tolist())), se, identified, why, info)

