"""The learning check in simulated worlds: HAPPO-trained DEAR against MAD, the round-0 majority and the best
fixed policy, with accuracy, tokens and the training objective, over training seeds. Every number is synthetic.

    python -m train.learning_check --config sim --seeds 1,2,3 --out results/learning-check-sim
    python -m train.learning_check --worlds all --seeds 1,2,3 --out results/learning-suite run.iterations=100
    python -m train.learning_check --worlds all --seeds 1 --out results/learning-suite-ablations/mappo \
        run.iterations=100 happo.algorithm=mappo
    python -m train.learning_check --ablations results/learning-suite-ablations --out results/learning-suite

The learning suite (`--worlds`) is a set of worlds whose best policies differ (docs/DESIGN.md §6b, `WORLDS`): the world
fitted to real debates (reading nobody is best), the stylised world (a temperature bound is best), a world where
debate pays (the best fixed policy reads most peers) and one where the best policy depends on the state (read
only where agents disagree). A learner that works reaches each world's best fixed policy from its default settings, and
beats it where the optimum depends on the state.

All rows of a world are evaluated on the same held-out debates (the test split, `--episodes` debates from
`--eval-seed`, with the config's run seed for the engine, whatever the training seed):
- `round-0 majority`: the plurality vote of round 0 (tokens: round 0 alone);
- `MAD`: full mask, every agent at `policy.fixed_temperature` / `policy.fixed_top_p`;
- `best fixed policy`: every pair read with one probability p and every agent at one (T, top-p), the best of the
  `--grid-*` grid by the objective on the *train* split (`--select-episodes` debates), so the test rows choose
  nothing; then evaluated like the others. With silent turns, reading nobody makes no call, so its T / top-p
  mean nothing and the grid holds it once;
- `DEAR, seed s`: the config's HAPPO run with `run.seed = s`, acting deterministically (pairs with p > 0.5, the
  behavior mean), and the mean over seeds.
The objective is accuracy − token_cost × tokens / 1000, the reward DEAR is trained on; accuracy counts a tied
vote as its expected value (1/k for a k-way tie holding the correct answer).

Each finished row is appended to `rows.jsonl` at once; the same command skips the rows it already has
(`settings.json` guards the settings), so a stopped check continues. Outputs per world: `rows.jsonl`, `table.md`,
`rows.csv`, `settings.json`, `curves.png` (objective, read density and mean temperature per training iteration
and seed) and the DEAR runs under `runs/`; with `--worlds`, one directory per world and `summary.md` over them.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from dear.atomic import atomic_write_text, write_json
from dear.cli import comma_list, command_line
from dear.cli import run as run_cli
from dear.policy import JointPolicy
from envs.reward import objective
from train.build import policy_config
from train.config import TrainConfig, config_names, load_config, with_settings_before_the_key
from train.evaluate import evaluate
from train.logger import read_metrics
from train.runner import Trainer

log = logging.getLogger("train.learning_check")
PROG = "python -m train.learning_check"


@dataclass(frozen=True)
class World:
    """One world of the learning suite: its config and where its optimum is (documented in the config)."""

    config: str
    optimum: str


WORLDS: dict[str, World] = {
    "fitted": World("sim", "read nobody (the round-0 majority): exchange rounds do not pay in the fitted world"),
    "stylised": World("sim-stylised", "read nobody at the lowest temperature"),
    "debate-pays": World("sim-debate-pays", "read many peers: exchanges fix wrong agents (MAD far above round 0)"),
    "state-dependent": World("sim-state-dependent", "read only where agents disagree: no fixed policy is optimal"),
}
TOLERANCE = 0.005  # DEAR reaches a world's best fixed policy when its objective is at most this much below


@dataclass(frozen=True)
class FixedPolicy:
    """Each ordered pair read with probability `p` (0: nobody, 1: full mesh), every agent at (T, top-p)."""

    p: float
    temperature: float
    top_p: float

    @property
    def label(self) -> str:
        return f"p={self.p:g}, T={self.temperature:g}, top-p={self.top_p:g}"


def fixed_policy(cfg: TrainConfig, fp: FixedPolicy, kinds: str = "revise", stop: str = "never",
                 stop_agree: float = 1.0) -> JointPolicy:
    """A JointPolicy that plays `fp` (selection "full" for p = 1, else "random" with random_p = p); with the
    extended action set every agent's turn is `kinds` and the stop follows `stop` (the paper's: revise, never)."""
    pc = dataclasses.replace(policy_config(cfg), selection_mode="full" if fp.p >= 1 else "random", random_p=fp.p,
                             behavior_mode="fixed", fixed_temperature=fp.temperature, fixed_top_p=fp.top_p,
                             kinds_mode=kinds, stop_mode=stop, stop_agree=stop_agree)
    return JointPolicy(pc)


@dataclass(frozen=True)
class RuleBaseline:
    """A strong baseline that the extended action set plays as one fixed setting of the policy."""

    key: str
    name: str
    kinds: str  # every agent's turn kind after round 0
    stop: str  # never | agree
    agree: int | None  # stop = agree: once the vote's leader holds this many answers (None: all V agree)
    decision: str  # the final vote's answers

    def policy(self, cfg: TrainConfig) -> JointPolicy:
        v = cfg.env.n_agents
        return fixed_policy(cfg, mad(cfg), self.kinds, self.stop, (self.agree or v) / v)


# With V agents and R rounds, SC draws V(R+1) samples (9 at V = 3, R = 2); adaptive SC stops once 2 agree.
RULE_BASELINES = (
    RuleBaseline("sc", "SC (every turn a fresh sample, vote over all)", "fresh", "never", None, "all-answers"),
    RuleBaseline("adaptive-sc", "adaptive SC (fresh samples until 2 agree)", "fresh", "agree", 2, "all-answers"),
    RuleBaseline("mad-stop", "MAD-stop (stop once unanimous)", "revise", "agree", None, "last-round"),
)


def with_decision(cfg: TrainConfig, decision: str) -> TrainConfig:
    """The config with another final-vote rule (a baseline's own)."""
    return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, decision=decision))


def mad(cfg: TrainConfig) -> FixedPolicy:
    return FixedPolicy(1.0, cfg.policy.fixed_temperature, cfg.policy.fixed_top_p)


def distinct_grid(cfg: TrainConfig, grid: Sequence[FixedPolicy]) -> list[FixedPolicy]:
    """The grid without points that play the same debates: with silent turns, reading nobody makes no call, so
    every (T, top-p) of p = 0 is one policy (kept once, at the config's fixed sampling)."""
    if not cfg.env.silent:
        return list(grid)
    nobody = [fp for fp in grid if fp.p == 0]
    rest = [fp for fp in grid if fp.p != 0]
    return ([FixedPolicy(0.0, cfg.policy.fixed_temperature, cfg.policy.fixed_top_p)] if nobody else []) + rest


@dataclass(frozen=True)
class Row:
    name: str  # e.g. "DEAR, seed 1 (synthetic)"
    kind: str  # round0 | mad | best-fixed | dear
    accuracy: float
    tokens_per_question: float
    completion_tokens_per_question: float
    hcr: float
    mask_density: float
    mean_temperature: float
    episodes: int
    detail: str = ""  # the fixed policy chosen, the DEAR seed's run directory
    scores: list[float] = field(default_factory=list)  # per test debate, in order: 1 correct, 1/k on a k-way tie
    objectives: list[float] = field(default_factory=list)  # per test debate: score − token_cost × tokens / 1000
    cpu_s: float = 0.0  # CPU seconds this row took (training included)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _row(name: str, kind: str, m: dict[str, float], detail: str = "", eps: Sequence = (), cost: float = 0.0,
         cpu_s: float = 0.0, round0: bool = False) -> Row:
    """A row from `evaluate`'s metrics and its per-debate EpisodeStats (`round0`: score round 0 alone)."""
    if round0:
        scores = [e.round0_accuracy for e in eps]
        objectives = [objective(e.round0_accuracy, e.round0_tokens, cost) for e in eps]
    else:
        scores = [e.final_score for e in eps]
        objectives = [objective(e.final_score, e.tokens, cost) for e in eps]
    return Row(f"{name} (synthetic)", kind, m["rollout/accuracy"], m["rollout/tokens_per_question"],
               m["rollout/completion_tokens_per_question"], m["rollout/hcr"], m["rollout/mask_density"],
               m["rollout/mean_temperature"], int(m["rollout/episodes"]), detail, [float(x) for x in scores],
               [float(x) for x in objectives], cpu_s)


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Mean of a − b over the same debates with its 95 % t-interval (paired); NaNs without two pairs."""
    if len(a) != len(b) or len(a) < 2:
        return math.nan, math.nan, math.nan
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return float(d.mean()), float(d.mean()) - half, float(d.mean()) + half


def objective_of(cfg: TrainConfig, m: dict[str, float]) -> float:
    """What DEAR is trained to maximise (the env's terminal reward), from rollout metrics."""
    return objective(m["rollout/accuracy"], m["rollout/tokens_per_question"], cfg.env.token_cost)


def best_fixed(cfg: TrainConfig, grid: Sequence[FixedPolicy], episodes: int, seed: int) -> tuple[FixedPolicy, list]:
    """The grid's best fixed policy by the objective on the train split (ties: fewer tokens); with every score
    as (policy, accuracy, tokens per question, objective)."""
    scores = []
    for fp in distinct_grid(cfg, grid):
        m = evaluate(cfg, fixed_policy(cfg, fp), episodes, seed=seed, split="train")
        scores.append((fp, m["rollout/accuracy"], m["rollout/tokens_per_question"], objective_of(cfg, m)))
        log.info("fixed %s: train accuracy %.3f, %.0f tokens/question, objective %.3f", fp.label, *scores[-1][1:])
    best = max(scores, key=lambda s: (s[3], -s[2]))[0]
    return best, scores


# ---------------------------------------------------------------- the check, resumable row by row
class CheckDir:
    def __init__(self, out: Path, settings: dict[str, Any]):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        saved = out / "settings.json"
        if saved.exists():
            old = json.loads(saved.read_text())
            if isinstance(old.get("resolved_config"), dict):  # settings saved before a config key existed
                old["resolved_config"] = with_settings_before_the_key(old["resolved_config"])
            old.pop("seeds", None)  # checks written before seeds could be added later stored them
            # The overrides say only how a setting was given (today's default may have been an override then,
            # and the reverse): the resolved config is what the check ran with.
            diff = sorted(k for k in set(old) | set(settings) if k != "overrides" and old.get(k) != settings.get(k))
            if diff:
                raise ValueError(f"{out} holds a check with other settings ({', '.join(diff)}); use another --out")
            settings = {**settings, "overrides": old.get("overrides", settings["overrides"])}
        else:
            write_json(saved, settings, indent=2, trailing_newline=True)
        self.settings = settings  # as the check was first run (its tables name the overrides it was made with)

    def rows(self) -> dict[str, dict]:
        return {r["key"]: r for r in read_rows(self.out)}

    def add(self, key: str, row: Row, **extra: Any) -> None:
        with open(self.out / "rows.jsonl", "a") as f:
            f.write(json.dumps({"key": key, **row.to_dict(), **extra}, default=float) + "\n")


def run_check(cfg_name: str, overrides: Sequence[str], seeds: Sequence[int], out: Path, episodes: int,
              eval_seed: int, grid: Sequence[FixedPolicy], select_episodes: int, command: str) -> list[dict]:
    base = load_config(cfg_name, [*overrides, "logging.progress=false"])
    cost = base.env.token_cost
    # The seeds are not a setting: each seed is its own row, so a later run may add seeds to a check.
    settings = {"config": cfg_name, "overrides": list(overrides), "episodes": episodes,
                "eval_seed": eval_seed, "grid": [dataclasses.asdict(g) for g in grid],
                "select_episodes": select_episodes, "llm": base.llm.backend_spec(), "token_cost": cost,
                "resolved_config": json.loads(json.dumps(base.to_dict(), default=str))}  # a config file edited since
    run = CheckDir(out, settings)
    done = run.rows()

    extended = base.env.actions == "extended"
    paper = with_decision(base, "last-round")  # MAD, round 0 and the fixed grid vote as the paper's

    def test(policy: JointPolicy, eps: list, cfg: TrainConfig = paper) -> dict[str, float]:
        # every row on the same test debates
        return evaluate(cfg, policy, episodes, seed=eval_seed, split="test", per_episode=eps)

    if "round0" not in done or "mad" not in done:
        t0, eps = time.process_time(), []
        m = test(fixed_policy(base, mad(base)), eps)
        r0 = dict(m, **{"rollout/accuracy": m["rollout/round0_accuracy"],
                        "rollout/tokens_per_question": m["rollout/round0_tokens_per_question"],
                        "rollout/completion_tokens_per_question": math.nan, "rollout/hcr": math.nan,
                        "rollout/mask_density": math.nan, "rollout/mean_temperature": math.nan})
        cpu = time.process_time() - t0
        if "round0" not in done:
            # round 0 is the MAD debates' own first round: its CPU time is counted once, on the MAD row
            run.add("round0", _row("round-0 majority", "round0", r0, eps=eps, cost=cost, round0=True))
        if "mad" not in done:
            run.add("mad", _row("MAD", "mad", m, mad(base).label, eps, cost, cpu))
    if "best-fixed" not in done:
        t0, eps = time.process_time(), []
        best, scores = best_fixed(paper, grid, select_episodes, eval_seed)
        m = test(fixed_policy(base, best), eps)
        label = best.label if not (base.env.silent and best.p == 0) else "read nobody (silent: no call)"
        run.add("best-fixed", _row("best fixed policy", "best-fixed", m, label, eps, cost, time.process_time() - t0),
                train_scores=[{"policy": fp.label, "accuracy": a, "tokens_per_question": t, "objective": o}
                              for fp, a, t, o in scores])
    for rule in RULE_BASELINES if extended else ():
        if rule.key not in done:
            t0, eps = time.process_time(), []
            m = test(rule.policy(base), eps, with_decision(base, rule.decision))
            run.add(rule.key, _row(rule.name, rule.key, m, f"{rule.kinds}, stop {rule.stop}, vote {rule.decision}",
                                   eps, cost, time.process_time() - t0))
    for seed in seeds:
        key = f"dear-{seed}"
        if key in done:
            continue
        t0, eps = time.process_time(), []
        cfg = load_config(cfg_name, [*overrides, "logging.progress=false", f"run.seed={seed}",
                                     f"run.out_dir={out / 'runs'}"])
        trainer = Trainer(cfg)
        try:
            result = trainer.train()
            m = test(trainer.policy, eps, base)
        finally:
            trainer.close()
        run.add(key, _row(f"DEAR, seed {seed}", "dear", m, str(result.run_dir), eps, cost,
                          time.process_time() - t0))
    rows = list(run.rows().values())
    write_tables(out, rows, run.settings, command)
    write_curves(out, rows, cost)
    return rows


def _mean_row(rows: Sequence[dict]) -> dict:
    keys = ("accuracy", "tokens_per_question", "completion_tokens_per_question", "hcr", "mask_density",
            "mean_temperature")

    def mean_of(name: str) -> list[float]:
        lists = [r.get(name) or [] for r in rows]
        return np.mean(lists, axis=0).tolist() if all(len(x) == len(lists[0]) > 0 for x in lists) else []

    return {"name": f"DEAR, mean of {len(rows)} seeds (synthetic)", "kind": "dear-mean",
            "episodes": rows[0]["episodes"], "detail": "", "scores": mean_of("scores"),
            "objectives": mean_of("objectives"), "cpu_s": float(sum(r.get("cpu_s", 0.0) for r in rows)),
            **{k: float(np.nanmean([r[k] for r in rows])) for k in keys}}


def shown_rows(rows: Sequence[dict]) -> list[dict]:
    dear = [r for r in rows if r["kind"] == "dear"]
    return [*rows, _mean_row(dear)] if dear else list(rows)


def write_tables(out: Path, rows: Sequence[dict], settings: dict[str, Any], command: str) -> None:
    shown = shown_rows(rows)
    cols = ("name", "accuracy", "tokens_per_question", "completion_tokens_per_question", "hcr", "mask_density",
            "mean_temperature", "episodes", "detail")
    cost = float(settings.get("token_cost", math.nan))

    def row_objective(r: dict) -> float:  # what DEAR is trained to maximise: the env's terminal reward
        return objective(r["accuracy"], r["tokens_per_question"], cost)

    mad_scores = next((r.get("scores") or [] for r in rows if r["kind"] == "mad"), [])
    best_obj = next((r.get("objectives") or [] for r in rows if r["kind"] == "best-fixed"), [])
    with open(out / "rows.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["synthetic", *cols, "objective", "minus_mad", "minus_mad_ci_low", "minus_mad_ci_high",
                    "objective_minus_best_fixed", "obj_minus_best_ci_low", "obj_minus_best_ci_high", "cpu_minutes"])
        for r in shown:
            w.writerow(["true", *(r[c] for c in cols), row_objective(r),
                        *paired_difference(r.get("scores") or [], mad_scores),
                        *paired_difference(r.get("objectives") or [], best_obj), r.get("cpu_s", 0.0) / 60])

    def fmt(x: float, d: int = 3) -> str:
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"

    lines = [f"# Learning check in a simulated world (SYNTHETIC: `{settings['llm']}` debaters)", "",
             f"Command: `{command}`  ",
             f"Config `{settings['config']}` {' '.join(settings['overrides'])}; evaluation: {settings['episodes']} "
             f"test-split debates from seed {settings['eval_seed']}, the same for every row; best fixed policy "
             f"chosen by the objective on {settings['select_episodes']} train-split debates. Objective = accuracy − "
             f"{cost:g} × tokens / 1000, the reward DEAR is trained on. − MAD: accuracy difference on the same "
             "debates; − best fixed: objective difference on the same debates; both with paired 95 % t-intervals. "
             "Every row counts a tied vote as its expected value (1/k for a k-way tie holding the correct "
             "answer).", "",
             "| policy (synthetic) | accuracy | − MAD [95 % CI] | tokens / question | objective | − best fixed "
             "[95 % CI] | HCR | mask density | mean T | CPU min | detail |",
             "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in shown:
        d, lo, hi = paired_difference(r.get("scores") or [], mad_scores)
        od, olo, ohi = paired_difference(r.get("objectives") or [], best_obj)
        lines.append(f"| {r['name']} | {fmt(r['accuracy'])} | {fmt(d)} [{fmt(lo)}, {fmt(hi)}] | "
                     f"{fmt(r['tokens_per_question'], 0)} | {fmt(row_objective(r))} | {fmt(od)} [{fmt(olo)}, {fmt(ohi)}] | "
                     f"{fmt(r['hcr'], 2)} | {fmt(r['mask_density'], 2)} | {fmt(r['mean_temperature'], 2)} | "
                     f"{fmt(r.get('cpu_s', 0.0) / 60, 1)} | {r['detail']} |")
    atomic_write_text(out / "table.md", "\n".join(lines) + "\n")


def write_curves(out: Path, rows: Sequence[dict], cost: float) -> None:
    """curves.png: per training iteration and DEAR seed, the rollout objective, read density and mean T
    (training rollouts, sampled actions; synthetic)."""
    runs = [(r["name"], Path(r["detail"])) for r in rows if r["kind"] == "dear"]
    series = []
    for name, run_dir in runs:
        metrics = read_metrics(run_dir / "metrics.jsonl")
        if metrics:
            series.append((name, metrics))
    if not series:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def get(row: dict, key: str) -> float:
        return float(row.get(f"synthetic/{key}", row.get(key, math.nan)))

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for name, metrics in series:
        it = [int(m["iteration"]) for m in metrics]
        acc = np.array([get(m, "rollout/accuracy") for m in metrics])
        tok = np.array([get(m, "rollout/tokens_per_question") for m in metrics])
        axes[0].plot(it, objective(acc, tok, cost), label=name)
        axes[1].plot(it, [get(m, "rollout/mask_density") for m in metrics], label=name)
        axes[2].plot(it, [get(m, "rollout/mean_temperature") for m in metrics], label=name)
    best = next((r for r in rows if r["kind"] == "best-fixed"), None)
    if best is not None:
        axes[0].axhline(objective(best["accuracy"], best["tokens_per_question"], cost), color="k", ls="--",
                        label="best fixed policy, test (synthetic)")
    for ax, title in zip(axes, ("objective (synthetic)", "read density (synthetic)", "mean temperature (synthetic)")):
        ax.set_title(title)
        ax.set_xlabel("iteration")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"SYNTHETIC learning curves: {out.name}")
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- the suite
def strongest_baseline(rows: Sequence[dict], rules_only: bool = False) -> dict | None:
    """The best fixed policy, or with the extended action set the rule baseline (SC, adaptive SC, MAD-stop) with a
    higher mean objective on the test debates: what DEAR must reach. `rules_only`: the best rule baseline alone
    (None without them), the bar of the extended action set's learning check (issue 39)."""
    rules = {b.key for b in RULE_BASELINES}
    candidates = [r for r in rows if r["kind"] in rules or (r["kind"] == "best-fixed" and not rules_only)]
    return max(candidates, key=lambda r: float(np.mean(r["objectives"]))) if candidates else None


def suite_verdict(rows: Sequence[dict], rules_only: bool = False) -> dict[str, Any]:
    """DEAR's mean against the world's strongest baseline (`strongest_baseline`) on the same debates, by the
    objective."""
    best = strongest_baseline(rows, rules_only)
    dear = [r for r in rows if r["kind"] == "dear"]
    if not dear:
        return {"best": best, "mean": None}
    mean = _mean_row(dear)
    d, lo, hi = paired_difference(mean["objectives"], best["objectives"])
    return {"best": best, "mean": mean, "diff": d, "low": lo, "high": hi, "reached": d >= -TOLERANCE,
            "beats": lo > 0, "per_seed": [float(np.mean(r["objectives"])) for r in dear]}


def _signed(x: float) -> str:
    """+0.012 / -0.012; a difference that rounds to zero prints +0.000 (never -0.000)."""
    return f"{round(x, 3) + 0.0:+.3f}"


def write_suite_summary(out: Path, results: dict[str, list[dict]], command: str) -> None:
    rules = {b.key for b in RULE_BASELINES}
    extended = any(r["kind"] in rules for rows in results.values() for r in rows)
    best = "the strongest baseline" if extended else "the best fixed policy"
    intro = ("Per world: the best fixed policy (chosen on the train split by the objective)"
             + (", the rule baselines (SC, adaptive SC, MAD-stop; the extended action set)" if extended else "")
             + f" and DEAR (HAPPO, default settings, mean of the seeds) on the same test debates. DEAR reaches the "
             f"world when its objective is at least {best}'s − {TOLERANCE}; in the state-dependent world it must "
             f"beat it (paired 95 % t-interval above 0). Details per world in `<world>/table.md` and "
             f"`<world>/curves.png`.")
    column = "strongest baseline" if extended else "best fixed"
    where = "where the paper actions' optimum is" if extended else "where the optimum is"
    if extended:
        intro += (" The last two columns hold DEAR against the best of the rule baselines alone (SC, adaptive SC, "
                  "MAD-stop: the bar of the extended action set, whose vote is not the paper's), reached within the "
                  "same tolerance.")
    rule_cols = " DEAR − best rule baseline [95 % CI] | verdict |" if extended else ""
    lines = ["# Learning suite (SYNTHETIC worlds with known optima)", "", f"Command: `{command}`", "", intro, "",
             f"| world (synthetic) | {where} | {column} (objective) | DEAR mean objective (seeds) | "
             f"DEAR − {column} [95 % CI] | verdict | CPU min |{rule_cols}",
             "|---|---|---|---:|---|---|---:|" + ("---|---|" if extended else "")]
    for name, rows in results.items():
        v = suite_verdict(rows)
        b = v["best"]
        label = f"{b['name'].removesuffix(' (synthetic)')}: {b['detail']}" if b["kind"] in rules else b["detail"]
        best_obj = float(np.mean(b["objectives"]))
        cpu = sum(r.get("cpu_s", 0.0) for r in rows) / 60
        if v["mean"] is None:
            lines.append(f"| {name} | {WORLDS[name].optimum} | {label} ({best_obj:.3f}) | – | – | – | {cpu:.1f} |")
            continue
        verdict = ("beats it" if v["beats"] else "reaches it" if v["reached"] else "misses it")
        if name == "state-dependent" and not v["beats"]:
            verdict += " (must beat it)"
        seeds = " / ".join(f"{x:.3f}" for x in v["per_seed"])
        line = (f"| {name} | {WORLDS[name].optimum} | {label} ({best_obj:.3f}) | "
                f"{float(np.mean(v['mean']['objectives'])):.3f} ({seeds}) | {_signed(v['diff'])} "
                f"[{_signed(v['low'])}, {_signed(v['high'])}] | {verdict} | {cpu:.1f} |")
        if extended:
            r = suite_verdict(rows, rules_only=True)
            rule_verdict = "beats it" if r["beats"] else "reaches it" if r["reached"] else "misses it"
            line += (f" {_signed(r['diff'])} [{_signed(r['low'])}, {_signed(r['high'])}] vs "
                     f"{r['best']['name'].removesuffix(' (synthetic)')} | {rule_verdict} |")
        lines.append(line)
    atomic_write_text(out / "summary.md", "\n".join(lines) + "\n")


def read_rows(out: Path) -> list[dict]:
    path = out / "rows.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_ablation_table(out: Path, defaults: Path, command: str) -> str:
    """summary.md over the ablation suites under `out` (one directory each, `--worlds` layout): per ablation and
    world, the DEAR seed-s objective minus the world's best fixed policy on the same test debates, beside the
    defaults' seed-s run of the suite in `defaults` (the same seed, so the rows differ by the ablation alone)."""
    names = sorted(p.name for p in out.iterdir() if p.is_dir())
    lines = ["# Learning-suite ablations (SYNTHETIC worlds)", "", f"Command: `{command}`", "",
             ("Each row changes one learner setting from the defaults and trains one seed per world (100 iterations "
              "x 256 debates); cells: DEAR's objective minus the world's best fixed policy on the same 256 test "
              "debates, with its paired 95 % t-interval. The defaults row is the same seed of the main suite. One "
              "seed per cell: a reading of direction, not a precise ranking."), "",
             "| learner (synthetic) | " + " | ".join(WORLDS) + " |", "|---|" + "---|" * len(WORLDS)]

    def cells(root: Path, key: str) -> list[str]:
        row = []
        for world in WORLDS:
            rows = read_rows(root / world)
            best = next((r for r in rows if r["kind"] == "best-fixed"), None)
            dear = next((r for r in rows if r["key"] == key), None)
            if best is None or dear is None:
                row.append("–")
                continue
            d, lo, hi = paired_difference(dear["objectives"], best["objectives"])
            row.append(f"{_signed(d)} [{_signed(lo)}, {_signed(hi)}]")
        return row

    seeds = sorted({r["key"] for name in names for w in WORLDS for r in read_rows(out / name / w)
                    if r["kind"] == "dear"})
    key = seeds[0] if seeds else "dear-1"
    lines.append(f"| defaults ({key}) | " + " | ".join(cells(defaults, key)) + " |")
    for name in names:
        lines.append(f"| {name} ({key}) | " + " | ".join(cells(out / name, key)) + " |")
    text = "\n".join(lines) + "\n"
    atomic_write_text(out / "summary.md", text)
    return text


def parse_worlds(text: str) -> list[str]:
    names = list(WORLDS) if text == "all" else [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORLDS]
    if unknown or not names:
        raise ValueError(f"--worlds: unknown world(s) {unknown}; known: all, {', '.join(WORLDS)}")
    return names


# ---------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--config", default=None, help=f"one world: a train config, {' | '.join(config_names())} | "
                                                      "path/to/config.yaml (default: sim)")
    where.add_argument("--worlds", help=f"the learning suite: all, or comma-separated of {', '.join(WORLDS)}")
    where.add_argument("--ablations", type=Path, metavar="DIR",
                       help="write DIR/summary.md over the ablation suites in DIR's subdirectories, against the "
                            "defaults suite in --out (runs nothing)")
    ap.add_argument("--seeds", type=comma_list(int), default=(1, 2, 3),
                    help="training seeds of DEAR (default 1,2,3)")
    ap.add_argument("--out", type=Path, required=True, help="output directory (continued if it exists)")
    ap.add_argument("--episodes", type=int, default=256, help="test-split debates per row")
    ap.add_argument("--eval-seed", type=int, default=99)
    ap.add_argument("--grid-p", type=comma_list(float), default=(0.0, 0.25, 0.5, 0.75, 1.0),
                    help="fixed policies' pair probabilities")
    ap.add_argument("--grid-t", type=comma_list(float), default=(0.1, 0.4, 0.7, 1.0),
                    help="fixed policies' temperatures")
    ap.add_argument("--grid-top-p", type=comma_list(float), default=(0.5, 0.9),
                    help="fixed policies' top-p values")
    ap.add_argument("--select-episodes", type=int, default=256, help="train-split debates per grid point")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides for every world, e.g. run.iterations=100")
    a = ap.parse_args(argv)
    if a.episodes < 1 or a.select_episodes < 1:
        ap.error("--episodes and --select-episodes must be >= 1")
    if any(not 0 <= p <= 1 for p in a.grid_p):
        ap.error("--grid-p values must be in [0, 1]")
    grid = [FixedPolicy(p, t, q) for p, t, q in itertools.product(a.grid_p, a.grid_t, a.grid_top_p)]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    command = command_line(PROG, argv)
    if a.ablations is not None:
        print(write_ablation_table(a.ablations, a.out, command))
        return 0
    if a.worlds is None:
        run_check(a.config or "sim", a.overrides, a.seeds, a.out, a.episodes, a.eval_seed, grid, a.select_episodes,
                  command)
        print((a.out / "table.md").read_text())
        return 0
    results = {}
    for name in parse_worlds(a.worlds):
        results[name] = run_check(WORLDS[name].config, a.overrides, a.seeds, a.out / name, a.episodes,
                                  a.eval_seed, grid, a.select_episodes, command)
        write_suite_summary(a.out, results, command)
    print((a.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
