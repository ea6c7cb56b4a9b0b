"""Fit the simulator to a debate corpus (simworld.corpus) by maximum likelihood and validate it out of sample.

    python -m simworld.fit --corpus results/corpus-gsm8k --out results/corpus-gsm8k/fit

Split by question (seeded): `--holdout` of the logging-policy questions are held out; the MAD reference debates
(other questions, full mesh, T 0.7) are all held out too. Every dynamics parameter of dear/sim/ is fitted
by joint maximum likelihood on the training part (simworld.mle.fit_mle: no priors; the start point is only where
the optimiser begins), and parameters the data cannot identify are listed as such. Flips are rare in real debates,
so plain ML can push a logit to its bound (an unseen event called impossible); the fit therefore maximises a
ridge-penalised likelihood whose strength λ is chosen by `--cv-folds`-fold cross-validation by question on the
training part among `--ridge-grid` (λ = 0, plain ML, is a candidate and wins ties). The report scores every λ
on the held-out parts too. Completion length
(words_base, words_per_temp, words_sd) is the least-squares fit of completion tokens on temperature; the token counters
(prompt_chars_per_token, text_chars_per_token) are ratios of sums over the training turns, so a sim text counts
in a later prompt about what a real completion of its length counts.

On the held-out part the report gives:
- log-likelihood per transition, log P(transitions | round 0) / #transitions, with the question difficulty
  integrated out, for the fitted simulator, today's defaults (SimParams()) and a null model (an agent keeps its
  answer with one fitted probability k; an agent that changes a wrong answer becomes correct with one fitted
  probability q);
- calibration: predicted (one-step posterior predictive given the debate so far) vs observed C→I and I→C, by
  peers read (nobody / all agreeing / some disagreeing) and temperature bin, with counts and 95 % Wilson intervals;
- round-0 accuracy and unanimity, observed vs predicted;
- for the MAD debates: the simulator's final accuracy and tokens per question (engine + SimBackend on synthetic
  questions, same V, R, max tokens and layout) against the real ones.
Outputs in `--out`: `sim_params_synthetic_fit.json` (SimParams + identification; a sim params file, labelled
synthetic as every sim file), `fit_report.md`, `fit_report.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from dear.atomic import write_json
from dear.cli import comma_list, command_line
from dear.cli import run as run_cli
from dear.debate.corpus_file import read_corpus
from dear.llm.registry import is_synthetic
from dear.sim.backend import ANSWER_ONLY_STYLES
from dear.sim.likelihood import FitData
from dear.sim.params import SimParams
from dear.sim.records import DebateRecord, record_from_dict, transitions
from simworld import mle
from simworld.rates import compute_stats
from simworld.validation import (
    NullModel,
    agent_group,
    calibration,
    heldout_loglik,
    one_step_predictions,
    real_mad,
    round0_by_agent,
    round0_predictions,
    simulate_mad,
    wilson,
)

log = logging.getLogger("simworld.fit")
PROG = "python -m simworld.fit"
PARAMS_FILE = "sim_params_synthetic_fit.json"


# ---------------------------------------------------------------- data
@dataclass
class Corpus:
    """A corpus's settings and its finished debates as trace dicts, by kind."""

    settings: dict[str, Any]
    logging: list[dict]  # trace dicts
    mad: list[dict]


def load_corpus(path: str | Path) -> Corpus:
    """A corpus directory (or its corpus.jsonl.gz) with its settings.json; failed debates left out."""
    path = Path(path)
    records = read_corpus(path)
    settings_path = (path if path.is_dir() else path.parent) / "settings.json"
    settings = json.loads(settings_path.read_text()) if settings_path.exists() else {}
    ok = [r for r in records if not r["trace"].get("failed")]
    return Corpus(settings, [r["trace"] for r in ok if r["kind"] == "logging"],
                  [r["trace"] for r in ok if r["kind"] == "mad"])


def to_records(traces: Sequence[dict], where: str) -> list[DebateRecord]:
    """Trace dicts as the fit's records (failed debates dropped); `where` names them in errors."""
    out = [record_from_dict(t, f"{where}[{k}]") for k, t in enumerate(traces)]
    return [r for r in out if r is not None]


def split_by_question(traces: Sequence[dict], holdout: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Seeded split by question id (all debates of a question land on the same side)."""
    ids = sorted({t["question_id"] for t in traces})
    rng = np.random.default_rng(seed)
    rng.shuffle(ids)
    n_test = int(round(holdout * len(ids)))
    test = set(ids[:n_test])
    return [t for t in traces if t["question_id"] not in test], [t for t in traces if t["question_id"] in test]


def folds_by_question(traces: Sequence[dict], k: int, seed: int) -> list[list[dict]]:
    """k seeded folds by question id (all debates of a question in one fold), sizes within one question."""
    ids = sorted({t["question_id"] for t in traces})
    if k < 2 or len(ids) < k:
        raise ValueError(f"cross-validation needs 2 <= folds <= questions, got {k} folds for {len(ids)} questions")
    rng = np.random.default_rng(seed)
    rng.shuffle(ids)
    fold_of = {q: i % k for i, q in enumerate(ids)}
    return [[t for t in traces if fold_of[t["question_id"]] == i] for i in range(k)]


# ---------------------------------------------------------------- the penalty, chosen by cross-validation
@dataclass(frozen=True)
class RidgeCV:
    """k-fold cross-validation (by question, on the training part only) of the ridge strength λ."""

    grid: tuple[float, ...]  # ascending: a tie goes to the weaker penalty
    folds: int
    transitions: int  # held-out transitions pooled over the folds
    loglik_per_transition: tuple[float, ...]  # per λ: Σ_folds log P(held-out transitions | round 0) / transitions

    @property
    def chosen(self) -> float:
        return self.grid[int(np.argmax(self.loglik_per_transition))]


def ridge_by_cv(traces: Sequence[dict], grid: Sequence[float], k: int, seed: int) -> RidgeCV:
    grid = tuple(sorted(float(x) for x in grid))
    totals, n = np.zeros(len(grid)), 0
    for i, held in enumerate(folds_by_question(traces, k, seed)):
        held_ids = {t["question_id"] for t in held}
        train = [t for t in traces if t["question_id"] not in held_ids]
        data = FitData.of(to_records(held, f"fold {i}"))
        n += len(data.transitions)
        for g, lam in enumerate(grid):
            fit = mle.fit_mle(to_records(train, f"fold {i} train"), ridge=lam, standard_errors=False)
            totals[g] += heldout_loglik(fit.params, data)
            log.info("ridge CV fold %d/%d, lambda %g: held-out loglik %.2f over %d transitions", i + 1, k, lam,
                     totals[g], n)
    return RidgeCV(grid, k, n, tuple(float(x) for x in totals / max(1, n)))


# ---------------------------------------------------------------- the whole fit + validation
def length_turns(traces: Sequence[dict]) -> list[tuple[float, int, bool]]:
    """(temperature, completion tokens, cut at max_tokens) of every reasoning turn that did not fail (an
    answer-only agent's reply is the sim's answer line, not a length to fit)."""
    return [(float(t["temperature"]), int(t["completion_tokens"]), t.get("finish_reason") == "length")
            for tr in traces for turns in tr["rounds"] for t in turns
            if t.get("error") is None and t.get("style") not in ANSWER_ONLY_STYLES]


def validate_held_out(held: dict[str, list], fitted: SimParams, default: SimParams, null: NullModel,
                      by_ridge: dict[float, SimParams]) -> tuple[list[dict], dict, dict]:
    """Per held-out set: log-likelihood per transition (fitted, default, null, and the fit at each ridge λ), the
    one-step calibration and the round-0 predictions against what was observed."""
    ll_rows, calib, round0 = [], {}, {}
    for name, traces in held.items():
        if not traces:
            continue
        data = FitData.of(to_records(traces, name))
        n = len(data.transitions)
        ll_rows.append({"set": name, "debates": len(data.records), "transitions": n,
                        "fitted": heldout_loglik(fitted, data) / max(1, n),
                        "default": heldout_loglik(default, data) / max(1, n),
                        "null": null.loglik(data.transitions) / max(1, n),
                        "by_ridge": {str(lam): heldout_loglik(fp, data) / max(1, n) for lam, fp in
                                     sorted(by_ridge.items())}})
        preds = {"fitted": one_step_predictions(fitted, data), "default": one_step_predictions(default, data),
                 "null": np.array([null.p_new_correct(t) for t in data.transitions])}
        calib[name] = calibration(data.transitions, preds)
        stats = compute_stats(data.records)
        round0[name] = {"observed_accuracy": [stats["round-0 accuracy"].num, stats["round-0 accuracy"].den],
                        "observed_unanimous": [stats["round-0 unanimous questions"].num,
                                               stats["round-0 unanimous questions"].den],
                        "fitted": round0_predictions(fitted, data), "default": round0_predictions(default, data),
                        "by_agent": round0_by_agent(fitted, data)}
    return ll_rows, calib, round0


def run(corpus_dir: str | Path, out: str | Path, holdout: float, seed: int, sim_questions: int,
        command: str, ridge: float | None = None, ridge_grid: Sequence[float] = (0.0, 0.03, 0.3, 3.0),
        cv_folds: int = 4) -> dict[str, Any]:
    """Fit on the training part and validate on the held-out parts. `ridge` None: choose it among `ridge_grid`
    by `cv_folds`-fold cross-validation on the training part (the held-out parts never choose anything)."""
    t0 = time.perf_counter()
    corpus = load_corpus(corpus_dir)
    if not corpus.logging:
        raise ValueError(f"{corpus_dir} has no logging-policy debates to fit")
    train_tr, test_tr = split_by_question(corpus.logging, holdout, seed)
    if not train_tr or not test_tr:
        raise ValueError(f"--holdout {holdout} leaves an empty side ({len(train_tr)} train, "
                         f"{len(test_tr)} held-out debates)")
    train = to_records(train_tr, "train")
    cv = None
    if ridge is None:
        cv = ridge_by_cv(train_tr, ridge_grid, cv_folds, seed)
        ridge = cv.chosen
    fit = mle.fit_mle(train, ridge=ridge)
    # For the report only: the fit at every other λ of the grid, scored on the held-out parts as well.
    others = {lam: mle.fit_mle(train, ridge=lam, standard_errors=False).params
              for lam in (cv.grid if cv else ()) if lam != ridge}
    words = mle.fit_words(length_turns(train_tr))
    fitted = fit.params
    if words.get("identified") and words["words_base"] > 0 and words["words_per_temp"] >= 0:
        fitted = replace(fitted, words_base=words["words_base"], words_per_temp=words["words_per_temp"],
                         words_sd=words["resid_sd"])
        if words.get("slope_at_bound"):
            fit.why_not["words_per_temp"] = (
                f"the length did not grow with temperature (unconstrained slope {words['unconstrained_per_temp']:.1f}"
                f" ± {words['se_unconstrained'][1]:.1f} tokens per unit T): held at its bound 0, words_base = the mean")
    else:
        fit.why_not["words_base / words_per_temp"] = f"length fit unusable: {words}"
    chars = mle.fit_chars_per_token([t for tr in train_tr for turns in tr["rounds"] for t in turns])
    if chars["identified"]:
        fitted = replace(fitted, prompt_chars_per_token=chars["prompt_chars_per_token"],
                         text_chars_per_token=chars["text_chars_per_token"])
    else:
        fit.why_not["prompt_chars_per_token / text_chars_per_token"] = f"no usable turns: {chars}"
    default = SimParams()
    null = NullModel.fit(transitions(train))
    held = {"logging (held out)": test_tr, "MAD (all)": corpus.mad}
    ll_rows, calib, round0 = validate_held_out(held, fitted, default, null, {**others, ridge: fitted})
    mad = {"real": real_mad(corpus.mad)} if corpus.mad else {}
    if corpus.mad:
        mad["sim fitted (synthetic)"] = simulate_mad(fitted, corpus.settings, sim_questions, seed)
        mad["sim default (synthetic)"] = simulate_mad(default, corpus.settings, sim_questions, seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    identification = {"estimates": fit.estimates, "se": fit.se, "identified": fit.identified,
                      "not_identified": fit.why_not, "conventions": mle.MLE_CONVENTIONS}
    fitted.to_json(out / PARAMS_FILE, command=command, corpus=str(corpus_dir), split_seed=seed, holdout=holdout, ridge=ridge,
                   n_train_debates=len(train), identification=identification, words=words,
                   chars_per_token=chars,
                   fit_info={k: v for k, v in fit.info.items() if k not in ("conventions", "not_identified")})
    result = {"command": command, "corpus": str(corpus_dir), "settings": corpus.settings, "holdout": holdout,
              "split_seed": seed, "n_train_debates": len(train), "ridge": ridge,
              "ridge_cv": None if cv is None else {"grid": list(cv.grid), "folds": cv.folds,
                                                   "transitions": cv.transitions,
                                                   "loglik_per_transition": list(cv.loglik_per_transition)},
              "loglik_per_transition": ll_rows,
              "calibration": calib, "round0": round0, "mad": mad, "identification": identification,
              "null": {"k": null.k, "q": null.q}, "words": words, "chars_per_token": chars,
              "params": fitted.to_dict(),
              "seconds": time.perf_counter() - t0}
    write_json(out / "fit_report.json", result, indent=2, default=float, trailing_newline=True)
    (out / "fit_report.md").write_text(report_markdown(result, fitted, default))
    return result


# ---------------------------------------------------------------- report
def _f(x: float, d: int = 3) -> str:
    """A number with d decimals, or – for a missing or NaN value."""
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def ridge_section(r: dict[str, Any]) -> list[str]:
    """The penalty: chosen by cross-validation on the training part, then every λ scored on the held-out parts."""
    lam, cv = r["ridge"], r.get("ridge_cv")
    head = [f"## Penalty: λ = {lam:g}" + (" (plain maximum likelihood)" if lam == 0 else ""), ""]
    if cv is None:
        return head + ["λ was given on the command line (`--ridge`), not chosen by cross-validation."]
    head += [f"Ridge λ/2·Σθ² on the transition law's logit-scale parameters (`simworld.mle.PENALISED`), λ chosen "
             f"by {cv['folds']}-fold cross-validation by question on the training part ({cv['transitions']} "
             "held-out transitions pooled); the held-out columns below chose nothing.", "",
             "| λ | CV log-lik / transition | " + " | ".join(row["set"] for row in r["loglik_per_transition"]) + " |",
             "|---:|---:|" + "---:|" * len(r["loglik_per_transition"])]
    for g, ll in zip(cv["grid"], cv["loglik_per_transition"]):
        held = [_f(row.get("by_ridge", {}).get(str(float(g)))) for row in r["loglik_per_transition"]]
        mark = " ← chosen" if g == lam else ""
        head.append(f"| {g:g}{mark} | {_f(ll)} | " + " | ".join(held) + " |")
    return head


def report_markdown(r: dict[str, Any], fitted: SimParams, default: SimParams) -> str:
    tag = " (SYNTHETIC corpus: sim backend)" if is_synthetic(r["settings"].get("llm", "")) else ""
    lines = [f"# Simulator fitted to the debate corpus by maximum likelihood{tag}", "",
             f"Command: `{r['command']}`  ", f"Corpus: `{r['corpus']}`, settings {json.dumps(r['settings'])}.  ",
             f"Split by question, seed {r['split_seed']}: {r['n_train_debates']} logging debates fitted; "
             f"{100 * r['holdout']:.0f} % of the logging questions and all MAD debates held out. "
             f"Took {r['seconds']:.0f} s.", "",
             "## Held-out log-likelihood per transition (higher is better)", "",
             "log P(transitions | round 0) / #transitions, question difficulty integrated out. Null: keep the answer "
             f"w.p. k = {r['null']['k']:.3f}; a changed wrong answer is correct w.p. q = {r['null']['q']:.3f}.", "",
             "| held-out set | debates | transitions | fitted sim | default sim | null |", "|---|---:|---:|---:|---:|---:|"]
    for row in r["loglik_per_transition"]:
        lines.append(f"| {row['set']} | {row['debates']} | {row['transitions']} | {_f(row['fitted'])} | "
                     f"{_f(row['default'])} | {_f(row['null'])} |")
    lines += ["", *ridge_section(r)]
    profiles = r["settings"].get("agent_profiles")

    def label(group: str) -> str:  # "agent 2" -> "agent 2 (local:direct)" for a pool of profiles
        head, _, k = group.partition(" ")
        return f"{group} ({profiles[int(k)]})" if head == "agent" and profiles and int(k) < len(profiles) else group

    for name, rows in r["calibration"].items():
        lines += ["", f"## Calibration, {name}", "",
                  "Observed rate with 95 % Wilson interval vs the models' mean one-step predicted rate; ✓ = the fitted "
                  "prediction lies inside the interval.", "",
                  "| group | flip | n | observed | rate [95 % CI] | fitted | default | null |",
                  "|---|---|---:|---:|---|---:|---:|---:|"]
        for c in rows:
            mark = "✓" if c["fitted_inside"] else ("✗" if c["n"] else "")
            lines.append(f"| {label(c['group'])} | {c['flip']} | {c['n']} | {c['observed']} | {_f(c['rate'])} "
                         f"[{_f(c['ci_low'])}, {_f(c['ci_high'])}] | {_f(c['fitted'])} {mark} | "
                         f"{_f(c['default'])} | {_f(c['null'])} |")
    lines += ["", "## Round 0", "", "| set | accuracy observed | fitted | default | unanimous observed | fitted | "
              "default |", "|---|---|---:|---:|---|---:|---:|"]
    for name, z in r["round0"].items():
        (ka, na), (ku, nu) = z["observed_accuracy"], z["observed_unanimous"]
        lines.append(f"| {name} | {ka}/{na} = {_f(ka / max(1, na))} | {_f(z['fitted'][0])} | {_f(z['default'][0])} | "
                     f"{ku}/{nu} = {_f(ku / max(1, nu))} | {_f(z['fitted'][1])} | {_f(z['default'][1])} |")
    lines += ["", "Round-0 accuracy by agent (observed, and the fitted simulator's prediction with the difficulty "
              "integrated out; ✓ = inside the observed 95 % Wilson interval):", "",
              "| set | agent | observed | rate [95 % CI] | fitted |", "|---|---|---:|---|---:|"]
    for name, z in r["round0"].items():
        for row in z.get("by_agent", []):
            lo, hi = wilson(row["observed"], row["n"])
            mark = "✓" if row["n"] and lo <= row["predicted"] <= hi else "✗"
            lines.append(f"| {name} | {label(agent_group(row['agent']))} | {row['observed']}/{row['n']} | "
                         f"{_f(row['observed'] / max(1, row['n']))} [{_f(lo)}, {_f(hi)}] | "
                         f"{_f(row['predicted'])} {mark} |")
    if r["mad"]:
        lines += ["", "## MAD reference debates: final accuracy and tokens per question", "",
                  "Simulated: engine + SimBackend, MAD on synthetic test questions (same V, R, max tokens, layout).", "",
                  "| source | n | accuracy [95 % CI] | tokens / question | completion tokens / question |",
                  "|---|---:|---|---:|---:|"]
        if "chars_per_token" in r and r["chars_per_token"].get("identified"):
            c = r["chars_per_token"]
            lines[-3:-3] = [f"Token counters fitted on {c['n']} training turns: {c['prompt_chars_per_token']:.2f} "
                            f"prompt characters and {c['text_chars_per_token']:.2f} completion characters per "
                            "token.", ""]
        for name, m in r["mad"].items():
            lines.append(f"| {name} | {m['n']} | {_f(m['accuracy'])} [{_f(m['ci'][0])}, {_f(m['ci'][1])}] | "
                         f"{m['tokens_per_question']:.0f} | {m['completion_tokens_per_question']:.0f} |")
        lines += ["", "Completion tokens of one turn, by agent: " + "; ".join(
            f"{name}: " + " / ".join(f"{x:.0f}" for x in m.get("completion_tokens_per_agent", []))
            for name, m in r["mad"].items()) + "."]
    ident = r["identification"]
    lines += ["", "## Parameters", "", "Estimates on the optimisation scale with standard errors from the observed "
              "information (of the penalised objective when λ > 0: the penalty's curvature is included, so they are "
              "smaller than plain ML's); 'no' = not identified by these data (reason below).", "",
              "| parameter | estimate | s.e. | identified |", "|---|---:|---:|---|"]
    for n, v in ident["estimates"].items():
        lines.append(f"| {n} | {v:.3f} | {_f(ident['se'][n])} | {'yes' if ident['identified'][n] else 'no'} |")
    lines += ["", "Not identified / partially identified:", "",
              *([f"- `{k}`: {v}" for k, v in ident["not_identified"].items()] or ["- none"])]
    lines += ["", "Conventions (not estimates):", "", *(f"- `{k}`: {v}" for k, v in ident["conventions"].items()),
              "", "| SimParams field | default | fitted |", "|---|---:|---:|"]
    for f in fields(SimParams):
        a, b = getattr(default, f.name), getattr(fitted, f.name)
        fmt = (lambda v: "[" + ", ".join(f"{x:.3f}" for x in v) + "]") if f.name == "skills" else (lambda v: f"{v:.3f}")
        lines.append(f"| {f.name} | {fmt(a)} | {fmt(b)} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="corpus directory written by python -m simworld.corpus")
    ap.add_argument("--out", required=True, help="output directory (fit file, report)")
    ap.add_argument("--holdout", type=float, default=0.2, help="fraction of logging-policy questions held out")
    ap.add_argument("--seed", type=int, default=0, help="split seed (also the simulation seed)")
    ap.add_argument("--sim-questions", type=int, default=300, help="synthetic questions for the simulated MAD")
    ap.add_argument("--ridge", type=float, default=None,
                    help="penalty λ on the transition law's logit-scale parameters (0 = plain maximum likelihood); "
                         "default: chosen by cross-validation among --ridge-grid")
    ap.add_argument("--ridge-grid", type=comma_list(float), default=(0.0, 0.03, 0.3, 3.0),
                    metavar="L1,L2,...",
                    help="candidate λ for the cross-validation (default 0,0.03,0.3,3)")
    ap.add_argument("--cv-folds", type=int, default=4, help="folds (by question) of the cross-validation")
    a = ap.parse_args(argv)
    if a.ridge is not None and a.ridge < 0:
        ap.error("--ridge must be >= 0")
    if any(x < 0 for x in a.ridge_grid):
        ap.error("--ridge-grid values must be >= 0")
    if a.cv_folds < 2:
        ap.error("--cv-folds must be >= 2")
    if not 0.0 < a.holdout < 1.0:
        ap.error("--holdout must be in (0, 1)")
    if a.sim_questions < 1:
        ap.error("--sim-questions must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    command = command_line(PROG, argv)
    run(a.corpus, a.out, a.holdout, a.seed, a.sim_questions, command, ridge=a.ridge, ridge_grid=a.ridge_grid,
        cv_folds=a.cv_folds)
    print((Path(a.out) / "fit_report.md").read_text())
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
