"""The learning check in a simulated world: HAPPO-trained DEAR against MAD, the round-0 majority and the best
fixed policy, with accuracy and tokens per question, over training seeds. Every number is synthetic.

    python -m train.learning_check --config sim --seeds 1,2,3 --out results/learning-check-sim

All rows are evaluated on the same held-out debates (the test split, `--episodes` debates from `--eval-seed`):
- `round-0 majority`: the plurality vote of round 0 (tokens: round 0 alone);
- `MAD`: full mask, every agent at `policy.fixed_temperature` / `policy.fixed_top_p`;
- `best fixed policy`: every pair read with one probability p and every agent at one (T, top-p), the best of the
  `--grid-*` grid by accuracy on the *train* split (`--select-episodes` debates), so the test rows choose
  nothing; then evaluated like the others;
- `DEAR, seed s`: the config's HAPPO run with `run.seed = s`, acting deterministically (pairs with p > 0.5, the
  behavior mean), and the mean over seeds.

The world is whatever the config's `llm` is; with `llm: sim` (a hand-set or a fitted `SimParams`) the debates
are simulated, so the rows, the CSV's `synthetic` column and the headings say so. Each finished row is appended
to `rows.jsonl` at once; the same command skips the rows it already has (`settings.json` guards the settings),
so a stopped check continues. Outputs: `rows.jsonl`, `table.md`, `rows.csv`, `settings.json`, and the runs of
the DEAR seeds under `runs/`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from dear.cli import comma_list, command_line
from dear.cli import run as run_cli
from dear.policy import JointPolicy
from train.build import policy_config
from train.config import TrainConfig, load_config
from train.happo import Trainer, evaluate

log = logging.getLogger("train.learning_check")
PROG = "python -m train.learning_check"


@dataclass(frozen=True)
class FixedPolicy:
    """Each ordered pair read with probability `p` (0: nobody, 1: full mesh), every agent at (T, top-p)."""

    p: float
    temperature: float
    top_p: float

    @property
    def label(self) -> str:
        return f"p={self.p:g}, T={self.temperature:g}, top-p={self.top_p:g}"


def fixed_policy(cfg: TrainConfig, fp: FixedPolicy) -> JointPolicy:
    """A JointPolicy that plays `fp` (selection "full" for p = 1, else "random" with random_p = p)."""
    pc = dataclasses.replace(policy_config(cfg), selection_mode="full" if fp.p >= 1 else "random", random_p=fp.p,
                             behavior_mode="fixed", fixed_temperature=fp.temperature, fixed_top_p=fp.top_p)
    return JointPolicy(pc)


def mad(cfg: TrainConfig) -> FixedPolicy:
    return FixedPolicy(1.0, cfg.policy.fixed_temperature, cfg.policy.fixed_top_p)


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
    scores: list[float] = field(default_factory=list)  # per test debate, in order: 1 correct (round 0: 1/#tied)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _row(name: str, kind: str, m: dict[str, float], detail: str = "", scores: Sequence[float] = ()) -> Row:
    return Row(f"{name} (synthetic)", kind, m["rollout/accuracy"], m["rollout/tokens_per_question"],
               m["rollout/completion_tokens_per_question"], m["rollout/hcr"], m["rollout/mask_density"],
               m["rollout/mean_temperature"], int(m["rollout/episodes"]), detail, [float(x) for x in scores])


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Mean of a − b over the same debates with its 95 % t-interval (paired); NaNs without two pairs."""
    if len(a) != len(b) or len(a) < 2:
        return math.nan, math.nan, math.nan
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return float(d.mean()), float(d.mean()) - half, float(d.mean()) + half


def best_fixed(cfg: TrainConfig, grid: Sequence[FixedPolicy], episodes: int, seed: int) -> tuple[FixedPolicy, list]:
    """The grid's best fixed policy by accuracy on the train split (ties: fewer tokens); with every score."""
    scores = []
    for fp in grid:
        m = evaluate(cfg, fixed_policy(cfg, fp), episodes, seed=seed, split="train")
        scores.append((fp, m["rollout/accuracy"], m["rollout/tokens_per_question"]))
        log.info("fixed %s: train accuracy %.3f, %.0f tokens/question", fp.label, scores[-1][1], scores[-1][2])
    best = max(scores, key=lambda s: (s[1], -s[2]))[0]
    return best, scores


# ---------------------------------------------------------------- the check, resumable row by row
class CheckDir:
    def __init__(self, out: Path, settings: dict[str, Any]):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        saved = out / "settings.json"
        if saved.exists():
            old = json.loads(saved.read_text())
            if old != settings:
                diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
                raise SystemExit(f"{PROG}: error: {out} holds a check with other settings ({', '.join(diff)}); "
                                 "use another --out")
        else:
            saved.write_text(json.dumps(settings, indent=2) + "\n")

    def rows(self) -> dict[str, dict]:
        path = self.out / "rows.jsonl"
        if not path.exists():
            return {}
        return {(r := json.loads(line))["key"]: r for line in path.read_text().splitlines() if line.strip()}

    def add(self, key: str, row: Row, **extra: Any) -> None:
        with open(self.out / "rows.jsonl", "a") as f:
            f.write(json.dumps({"key": key, **row.to_dict(), **extra}, default=float) + "\n")


def run_check(cfg_name: str, overrides: Sequence[str], seeds: Sequence[int], out: Path, episodes: int,
              eval_seed: int, grid: Sequence[FixedPolicy], select_episodes: int, command: str) -> list[dict]:
    base = load_config(cfg_name, [*overrides, "logging.progress=false"])
    settings = {"config": cfg_name, "overrides": list(overrides), "seeds": list(seeds), "episodes": episodes,
                "eval_seed": eval_seed, "grid": [dataclasses.asdict(g) for g in grid],
                "select_episodes": select_episodes, "llm": base.llm.backend_spec(), "token_cost": base.env.token_cost,
                "resolved_config": json.loads(json.dumps(base.to_dict(), default=str))}  # a config file edited since
    run = CheckDir(out, settings)
    done = run.rows()
    if "round0" not in done or "mad" not in done:
        eps: list = []
        m = evaluate(base, fixed_policy(base, mad(base)), episodes, seed=eval_seed, split="test", per_episode=eps)
        r0 = dict(m, **{"rollout/accuracy": m["rollout/round0_accuracy"],
                        "rollout/tokens_per_question": m["rollout/round0_tokens_per_question"],
                        "rollout/completion_tokens_per_question": math.nan, "rollout/hcr": math.nan,
                        "rollout/mask_density": math.nan, "rollout/mean_temperature": math.nan})
        if "round0" not in done:
            run.add("round0", _row("round-0 majority", "round0", r0, scores=[e.round0_accuracy for e in eps]))
        if "mad" not in done:
            run.add("mad", _row("MAD", "mad", m, mad(base).label, [e.final_correct for e in eps]))
    if "best-fixed" not in done:
        best, scores = best_fixed(base, grid, select_episodes, eval_seed)
        eps = []
        m = evaluate(base, fixed_policy(base, best), episodes, seed=eval_seed, split="test", per_episode=eps)
        run.add("best-fixed", _row("best fixed policy", "best-fixed", m, best.label,
                                   [e.final_correct for e in eps]),
                train_scores=[{"policy": fp.label, "accuracy": a, "tokens_per_question": t} for fp, a, t in scores])
    for seed in seeds:
        key = f"dear-{seed}"
        if key in done:
            continue
        cfg = load_config(cfg_name, [*overrides, "logging.progress=false", f"run.seed={seed}",
                                     f"run.out_dir={out / 'runs'}"])
        trainer = Trainer(cfg)
        try:
            result = trainer.train()
            eps = []
            m = evaluate(cfg, trainer.policy, episodes, seed=eval_seed, split="test", per_episode=eps)
        finally:
            trainer.close()
        run.add(key, _row(f"DEAR, seed {seed}", "dear", m, str(result.run_dir), [e.final_correct for e in eps]))
    rows = list(run.rows().values())
    write_tables(out, rows, settings, command)
    return rows


def _mean_row(rows: Sequence[dict]) -> dict:
    keys = ("accuracy", "tokens_per_question", "completion_tokens_per_question", "hcr", "mask_density",
            "mean_temperature")
    scores = [r.get("scores") or [] for r in rows]
    mean_scores = np.mean(scores, axis=0).tolist() if all(len(x) == len(scores[0]) > 0 for x in scores) else []
    return {"name": f"DEAR, mean of {len(rows)} seeds (synthetic)", "kind": "dear-mean",
            "episodes": rows[0]["episodes"], "detail": "", "scores": mean_scores,
            **{k: float(np.nanmean([r[k] for r in rows])) for k in keys}}


def write_tables(out: Path, rows: Sequence[dict], settings: dict[str, Any], command: str) -> None:
    dear = [r for r in rows if r["kind"] == "dear"]
    shown = [*rows, _mean_row(dear)] if dear else list(rows)
    cols = ("name", "accuracy", "tokens_per_question", "completion_tokens_per_question", "hcr", "mask_density",
            "mean_temperature", "episodes", "detail")
    cost = float(settings.get("token_cost", math.nan))

    def objective(r: dict) -> float:  # what DEAR is trained to maximise: the env's terminal reward
        return r["accuracy"] - cost * r["tokens_per_question"] / 1000

    mad_scores = next((r.get("scores") or [] for r in rows if r["kind"] == "mad"), [])
    with open(out / "rows.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["synthetic", *cols, "objective", "minus_mad", "minus_mad_ci_low", "minus_mad_ci_high"])
        for r in shown:
            w.writerow(["true", *(r[c] for c in cols), objective(r),
                        *paired_difference(r.get("scores") or [], mad_scores)])

    def fmt(x: float, d: int = 3) -> str:
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"

    lines = [f"# Learning check in a simulated world (SYNTHETIC: `{settings['llm']}` debaters)", "",
             f"Command: `{command}`  ",
             f"Config `{settings['config']}` {' '.join(settings['overrides'])}; evaluation: {settings['episodes']} "
             f"test-split debates from seed {settings['eval_seed']}, the same for every row; best fixed policy "
             f"chosen on {settings['select_episodes']} train-split debates. Objective = accuracy − "
             f"{cost:g} × tokens / 1000, the reward DEAR is trained on. − MAD: accuracy difference on the same "
             "debates with its paired 95 % t-interval. Round-0 majority: a tie counts 1/#tied answers (its expected "
             "accuracy); later rows break ties by the seeded vote.", "",
             "| policy (synthetic) | accuracy | − MAD [95 % CI] | tokens / question | completion tokens / q | "
             "objective | HCR | mask density | mean T | detail |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in shown:
        d, lo, hi = paired_difference(r.get("scores") or [], mad_scores)
        lines.append(f"| {r['name']} | {fmt(r['accuracy'])} | {fmt(d)} [{fmt(lo)}, {fmt(hi)}] | "
                     f"{fmt(r['tokens_per_question'], 0)} | {fmt(r['completion_tokens_per_question'], 0)} | "
                     f"{fmt(objective(r))} | {fmt(r['hcr'], 2)} | {fmt(r['mask_density'], 2)} | {fmt(r['mean_temperature'], 2)} | "
                     f"{r['detail']} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="sim", help="train config name or path (default: sim)")
    ap.add_argument("--seeds", type=comma_list(int), default=(1, 2, 3),
                    help="training seeds of DEAR (default 1,2,3)")
    ap.add_argument("--out", type=Path, required=True, help="output directory (continued if it exists)")
    ap.add_argument("--episodes", type=int, default=256, help="test-split debates per row")
    ap.add_argument("--eval-seed", type=int, default=99)
    ap.add_argument("--grid-p", type=comma_list(float), default=(0.0, 0.5, 1.0),
                    help="fixed policies' pair probabilities")
    ap.add_argument("--grid-t", type=comma_list(float), default=(0.1, 0.4, 0.7, 1.0),
                    help="fixed policies' temperatures")
    ap.add_argument("--grid-top-p", type=comma_list(float), default=(0.5, 0.9),
                    help="fixed policies' top-p values")
    ap.add_argument("--select-episodes", type=int, default=256, help="train-split debates per grid point")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. run.iterations=10")
    a = ap.parse_args(argv)
    if a.episodes < 1 or a.select_episodes < 1:
        ap.error("--episodes and --select-episodes must be >= 1")
    if any(not 0 <= p <= 1 for p in a.grid_p):
        ap.error("--grid-p values must be in [0, 1]")
    grid = [FixedPolicy(p, t, q) for p, t, q in itertools.product(a.grid_p, a.grid_t, a.grid_top_p)]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    command = command_line(PROG, argv)
    run_check(a.config, a.overrides, a.seeds, a.out, a.episodes, a.eval_seed, grid, a.select_episodes, command)
    print((a.out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
