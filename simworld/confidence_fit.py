"""Fit the simulated world's confidence model to a bank's real samples, and validate it out of sample.

    python -m simworld.confidence_fit --out worlds/gsm8k-bank-confidence \
        --base worlds/gsm8k-fitted/sim_params_synthetic_texts.json \
        --into worlds/gsm8k-bank-confidence/sim_params_synthetic_texts_confidence.json

The model (dear/sim/confidence.py): log(-m) = mu_c + b_q + e for a sample's mean token log-probability m, with c
whether the sample is right, b_q ~ Normal(0, sd_question) shared by a question's samples, e ~ Normal(0, sd_c). Fitted
on the bank shelf's **train/fit** questions (`dear.tasks.held_out` false) by moments: mu_c the class means, b_q's
variance the between-question variance of the residuals beyond what the within-question noise explains, sd_c the
within-question spread of each class; validated on its **train/holdout** questions, never on test questions:
- per class, a Kolmogorov-Smirnov test of the held-out log(-m) against the fitted normal;
- the AUROC of m for "this sample is right": the held-out real samples' (Mann-Whitney, with a 95 % bootstrap interval
  over questions) against the fitted model's (Monte Carlo: the held-out samples' own right/wrong labels, each m drawn
  from its class).
- the share of log(-m)'s variance that lies between questions, real against the model's (Monte Carlo).

Writes OUT/confidence_fit.json (the five parameters, the fit and the validation, the command) and OUT/README.md;
`--base PARAMS --into FILE` also writes a sim parameter file: the world of PARAMS with the five parameters added (a
new file: the fitted world's own file stays the copy of its fit's output). Train or serve in it with
`llm.options.params_file=FILE`.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from dear.atomic import atomic_write_text, write_json
from dear.bank.backend import DEFAULT_BANK
from dear.bank.store import Bank, ShelfKey, shown_path
from dear.cli import command_line
from dear.cli import run as run_cli
from dear.confidence import record_of
from dear.sim.params import SimParams
from dear.tasks import held_out

log = logging.getLogger("simworld.confidence_fit")
PROG = "python -m simworld.confidence_fit"
SHELF = ShelfKey("gsm8k", "train", "cot", 0.7, 0.9, 384)
PARAMS = ("confidence_mu_correct", "confidence_sd_correct", "confidence_mu_wrong", "confidence_sd_wrong")


@dataclass(frozen=True)
class Sample:
    question_id: str
    z: float  # log(-mean token log-probability)
    correct: bool


def samples_of(bank: Bank, key: ShelfKey) -> list[Sample]:
    """Every sample of the shelf with a confidence record (m < 0)."""
    shelf = bank.shelf(key)
    out = []
    for q in shelf.questions:
        for s in shelf.of(q):
            record = record_of(s.confidence)
            if record is not None and record.mean_logprob < 0:
                out.append(Sample(q, float(np.log(-record.mean_logprob)), bool(s.correct)))
    return out


def fit(samples: Sequence[Sample]) -> dict[str, float]:
    """The five parameters by moments (module docstring)."""
    mu = {}
    for name, c in (("correct", True), ("wrong", False)):
        z = np.array([s.z for s in samples if s.correct == c])
        if len(z) < 2:
            raise ValueError(f"too few {name} samples to fit ({len(z)})")
        mu[c] = float(z.mean())
    residual: dict[str, list[tuple[float, bool]]] = {}
    for s in samples:
        residual.setdefault(s.question_id, []).append((s.z - mu[s.correct], s.correct))
    groups = [v for v in residual.values() if len(v) >= 2]
    # within-question deviations, each scaled by n/(n-1) so its expectation is the noise variance
    dev = {c: [] for c in (True, False)}
    for v in groups:
        m, n = np.mean([r for r, _ in v]), len(v)
        for r, c in v:
            dev[c].append((r - m) ** 2 * n / (n - 1))
    within = {c: float(np.mean(dev[c])) for c in dev}
    means = np.array([np.mean([r for r, _ in v]) for v in groups])
    noise = np.mean([np.mean([within[c] for _, c in v]) / len(v) for v in groups])
    between = max(0.0, float(np.var(means, ddof=1)) - float(noise))
    return {"confidence_mu_correct": mu[True], "confidence_sd_correct": float(np.sqrt(within[True])),
            "confidence_mu_wrong": mu[False], "confidence_sd_wrong": float(np.sqrt(within[False])),
            "confidence_sd_question": float(np.sqrt(between))}


def model_draws(params: dict[str, float], held: Sequence[Sample], rng: np.random.Generator) -> list[Sample]:
    """The model's m for the held-out samples' own questions and right/wrong labels (one Monte Carlo draw)."""
    shared = {q: float(rng.normal(0.0, params["confidence_sd_question"])) for q in sorted({s.question_id for s in held})}
    out = []
    for s in held:
        name = "correct" if s.correct else "wrong"
        z = params[f"confidence_mu_{name}"] + shared[s.question_id] + rng.normal(0.0, params[f"confidence_sd_{name}"])
        out.append(Sample(s.question_id, float(z), s.correct))
    return out


def auroc(samples: Sequence[Sample]) -> float:
    """P(a right sample's m exceeds a wrong one's), ties half (Mann-Whitney U / (n_right n_wrong)); m = -exp(z)."""
    right = [-np.exp(s.z) for s in samples if s.correct]
    wrong = [-np.exp(s.z) for s in samples if not s.correct]
    return float(stats.mannwhitneyu(right, wrong).statistic / (len(right) * len(wrong)))


def auroc_ci(samples: Sequence[Sample], n_boot: int, seed: int) -> tuple[float, float]:
    """95 % bootstrap interval of the AUROC, resampling questions."""
    by_q: dict[str, list[Sample]] = {}
    for s in samples:
        by_q.setdefault(s.question_id, []).append(s)
    qs = sorted(by_q)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_boot):
        drawn = [s for i in rng.integers(len(qs), size=len(qs)) for s in by_q[qs[i]]]
        if any(s.correct for s in drawn) and not all(s.correct for s in drawn):
            values.append(auroc(drawn))
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def model_stats(params: dict[str, float], held: Sequence[Sample], draws: int, seed: int) -> dict[str, float]:
    """The fitted model's AUROC and between-question shares on the held-out questions and labels (Monte Carlo)."""
    rng = np.random.default_rng(seed)
    runs = [model_draws(params, held, rng) for _ in range(draws)]
    return {"auroc": float(np.mean([auroc(r) for r in runs])),
            "share_correct": float(np.mean([between_question_share(r, True) for r in runs])),
            "share_wrong": float(np.mean([between_question_share(r, False) for r in runs]))}


def between_question_share(samples: Sequence[Sample], correct: bool) -> float:
    """Share of z's variance (one class) that lies between questions: what the independent-draw model leaves out."""
    by_q: dict[str, list[float]] = {}
    for s in samples:
        if s.correct == correct:
            by_q.setdefault(s.question_id, []).append(s.z)
    z = np.concatenate([np.array(v) for v in by_q.values()])
    means = np.concatenate([np.full(len(v), np.mean(v)) for v in by_q.values()])
    return float(np.var(means) / np.var(z))


def validate(params: dict[str, float], held: Sequence[Sample], n_boot: int, seed: int) -> dict[str, Any]:
    ks = {}
    for name, c in (("correct", True), ("wrong", False)):
        z = np.array([s.z for s in held if s.correct == c])
        sd = float(np.hypot(params[f"confidence_sd_{name}"], params["confidence_sd_question"]))  # b_q + e
        res = stats.kstest(z, "norm", args=(params[f"confidence_mu_{name}"], sd))
        ks[name] = {"n": len(z), "statistic": float(res.statistic), "p_value": float(res.pvalue)}
    lo, hi = auroc_ci(held, n_boot, seed)
    model = model_stats(params, held, 200, seed)
    return {"questions": len({s.question_id for s in held}), "samples": len(held), "ks": ks,
            "auroc_real": auroc(held), "auroc_real_ci": [lo, hi], "auroc_model": model["auroc"],
            "between_question_share": {"correct": between_question_share(held, True),
                                       "wrong": between_question_share(held, False),
                                       "model_correct": model["share_correct"], "model_wrong": model["share_wrong"]}}


def readme(doc: dict[str, Any]) -> str:
    p, v = doc["params"], doc["validation"]
    ks = v["ks"]
    lo, hi = v["auroc_real_ci"]
    return "\n".join([
        "# The simulated world's confidence model, fitted to the bank",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"Fitted on the real samples of `{doc['shelf']}` ({doc['bank']}), train/fit questions "
        f"({doc['fit']['questions']} questions, {doc['fit']['samples']} samples); validated on its train/holdout "
        f"questions ({v['questions']} questions, {v['samples']} samples). No test question is read.",
        "",
        "Model (dear/sim/confidence.py): log(−m) = mu_c + b_q + e for a sample's mean token log-probability m, c "
        f"whether the sample is right, b_q ~ Normal(0, {p['confidence_sd_question']:.3f}) shared by a question's "
        "samples, e ~ Normal(0, sd_c). KS: the held-out log(−m) of a class against Normal(mu_c, sqrt(sd_q² + sd_c²)).",
        "",
        "| class | mu_c | sd_c (within a question) | held-out KS statistic | KS p-value |",
        "|---|---:|---:|---:|---:|",
        *(f"| {c} | {p[f'confidence_mu_{c}']:.3f} | {p[f'confidence_sd_{c}']:.3f} | {ks[c]['statistic']:.3f} | "
          f"{ks[c]['p_value']:.3f} |" for c in ("correct", "wrong")),
        "",
        f"AUROC of m for \"this sample is right\", held out: real {v['auroc_real']:.3f} [{lo:.3f}, {hi:.3f}] "
        f"(95 % bootstrap over questions), the fitted model on the same labels {v['auroc_model']:.3f} (synthetic).",
        "",
        "Share of log(−m)'s variance between held-out questions (a question's samples share its difficulty): real "
        f"right {v['between_question_share']['correct']:.2f}, wrong {v['between_question_share']['wrong']:.2f}; the "
        f"model's {v['between_question_share']['model_correct']:.2f} and "
        f"{v['between_question_share']['model_wrong']:.2f} (synthetic). What it leaves out: whether a question is "
        "hard for the model moves its samples' correctness and their confidence together only through b_q's being "
        "shared, not through the sim's own difficulty draw (b_q is independent of it).",
        "",
    ])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bank", type=Path, default=Path(DEFAULT_BANK), help="bank directory (default: the committed one)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--base", type=Path, default=None, help="a sim parameter file whose world gets the confidence model")
    p.add_argument("--into", type=Path, default=None, help="where to write it (a new file, 'synthetic' in its name)")
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    bank = Bank.open(a.bank)
    if SHELF not in bank.keys:
        raise ValueError(f"{a.bank}: no shelf {SHELF.name}; build it with python -m dear.bank build --split train")
    every = samples_of(bank, SHELF)
    fit_part = [s for s in every if not held_out(s.question_id)]
    held = [s for s in every if held_out(s.question_id)]
    params = fit(fit_part)
    doc = {"command": command_line(PROG, argv), "bank": shown_path(a.bank), "shelf": SHELF.name,
           "model_file": bank.manifest.get("model_file", ""), "params": params,
           "fit": {"questions": len({s.question_id for s in fit_part}), "samples": len(fit_part)},
           "validation": validate(params, held, a.n_boot, a.seed)}
    a.out.mkdir(parents=True, exist_ok=True)
    write_json(a.out / "confidence_fit.json", doc, indent=2, trailing_newline=True)
    atomic_write_text(a.out / "README.md", readme(doc))
    if (a.base is None) != (a.into is None):
        raise ValueError("--base and --into go together: the world to add the model to, and the new file")
    if a.into is not None:
        if a.into.resolve() == a.base.resolve():
            raise ValueError(f"--into {a.into}: write a new file; {a.base} stays its fit's output")
        base = json.loads(a.base.read_text(encoding="utf-8"))
        merged = SimParams.from_dict({**base["params"], **params})  # validated
        kept = {k: v for k, v in base.items() if k not in ("model_id", "synthetic", "params", "confidence_fit")}
        merged.to_json(a.into, **kept, base=shown_path(a.base), confidence_fit=shown_path(a.out / "confidence_fit.json"))
    print(readme(doc))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
