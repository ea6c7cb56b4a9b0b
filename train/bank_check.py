"""The learning check in the bank world: HAPPO-trained DEAR against fixed sampling rules, on held-out train-bank
questions, and (with `--split test`) the final evaluation of the same rows on the test bank. Every turn is a real
sample of the embedded model replayed from its bank (nothing synthetic, nothing generated); nothing is fitted on
held-out or test questions.

    python -m train.bank_check --out results/bank-check-gsm8k --prices 0.01,0.05 --seeds 1 run.iterations=60
    python -m train.bank_check --split test --out results/bank-test-gsm8k --prices 0.01,0.05 --seeds 1

Per price (`env.token_cost`), every row is evaluated on the same debates: `--episodes` debates on `--split`
(default `train/holdout`, a fixed quarter of the train split: dear.tasks.held_out) from `--eval-seed`; each debate is
a question and a seeded order of its banked samples, so many debates per question average over orders.
- Fixed rules (`Rule`): start from S samples (S = 1, 2, 3), then each round either one agent draws a fresh sample
  (`fresh-one`) or every agent does (`fresh`), and stop once the vote's leader holds k samples (k = 1 stops at once;
  `never` runs every round). Single CoT is S = 1, k = 1; the round-0 majority S = 3, k = 1; adaptive SC from S is
  `fresh-one` with k = 2; SC is S = 1, `fresh`, never (1 + 3 + 3 = 7 samples).
- The best fixed rule: the grid's best by the objective on `--select-episodes` debates of `train/fit` (the questions
  DEAR trains on), then evaluated on the held-out debates like every row.
- The confidence rules, CISC-3 and confident stop (`dear.debate.sampling_rules`), their tau and threshold fitted at
  the price by order-averaged replay on `train/fit` questions: replayed on the banked samples of the same questions
  as the debates above (a question's k-th debate one seeded order of its samples), with no world in between.
- In a pool that mixes two reply modes (`env.agent_profiles`, e.g. cot, pot, cot), the fixed mixing rules instead of
  the confidence rules: adaptive SC from 2 over each mode alone and over every schedule of dear.debate.mode_mixing,
  replayed on the same questions (each mode's samples in their own seeded orders, as eval.mode_replay draws them).
- DEAR, seed s: the config (`configs/gsm8k.yaml`: `train/fit`) trained at that price, acting deterministically.
Objective = accuracy - price x tokens / 1000 (envs/reward.py), the reward DEAR is trained on. Differences to the
best fixed rule are paired over the same debates, with 95 % bootstrap intervals over questions. Rows are appended to `rows.jsonl` as they
finish and the same command continues a stopped check.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from dear.atomic import atomic_write_text
from dear.cli import comma_list, command_line
from dear.cli import run as run_cli
from dear.bank.replay import samples_of
from dear.debate.mode_mixing import SCHEDULES, drawn, pattern
from dear.debate.replay_orders import ReplayQuestion, fit_tau, fit_threshold, orders, permuted
from dear.debate.sampling_rules import CONFIDENT_STOP, RULE_SUMMARY, RuleParams, Samples, rule_outcome
from dear.policy import JointPolicy
from dear.tasks import held_out
from envs.reward import objective
from train.build import policy_config
from train.config import TrainConfig, load_config
from train.evaluate import evaluate
from train.learning_check import CheckDir, Row
from train.runner import Trainer

log = logging.getLogger("train.bank_check")
PROG = "python -m train.bank_check"
FIT, HOLDOUT = "train/fit", "train/holdout"


@dataclass(frozen=True)
class Rule:
    """A fixed sampling rule in the bank world (module docstring)."""

    start: int  # samples before the first decision
    kinds: str  # fresh-one | fresh: who draws a fresh sample each round
    agree: int | None  # stop once the vote's leader holds this many samples; None = never stop

    @property
    def label(self) -> str:
        stop = "never stop" if self.agree is None else ("stop at once" if self.agree == 1 else
                                                        f"stop when {self.agree} agree")
        return f"start {self.start}, {self.kinds}, {stop}"

    @property
    def key(self) -> str:
        return f"rule-s{self.start}-{self.kinds}-{self.agree or 'never'}"

    def config(self, base: TrainConfig) -> TrainConfig:
        return dataclasses.replace(base, env=dataclasses.replace(base.env, start_width=self.start))

    def policy(self, cfg: TrainConfig) -> JointPolicy:
        v = cfg.env.n_agents
        pc = dataclasses.replace(policy_config(cfg), behavior_mode="fixed",
                                 kinds_mode=self.kinds, stop_mode="never" if self.agree is None else "agree",
                                 stop_agree=(self.agree or v) / v)
        return JointPolicy(pc)


SAMPLE_ALL = Rule(1, "fresh", None)  # self-consistency: every agent draws every round, to the end


def named_rules(n_agents: int, n_rounds: int, budget: int | None = None,
                per_round: int | None = None) -> dict[Rule, str]:
    """The literature's rules among the grid's, by name (SC named by the samples it draws). In a world that draws
    one sample a round (`per_round`, env.fresh_per_round) every agent asking means the seats take turns: in a pool of
    reply modes, adaptive SC over the modes in turn."""
    named = {Rule(1, "fresh-one", 1): "single CoT",
             Rule(3, "fresh-one", 1): "round-0 majority of 3",
             Rule(1, "fresh-one", 2): "adaptive SC from 1",
             Rule(2, "fresh-one", 2): "adaptive SC from 2",
             Rule(3, "fresh-one", 2): "adaptive SC from 3",
             SAMPLE_ALL: f"SC-{max_samples(SAMPLE_ALL, n_agents, n_rounds, budget, per_round)}"}
    if per_round == 1:
        named |= {Rule(1, "fresh", 2): "adaptive SC from 1, seats in turn",
                  Rule(2, "fresh", 2): "adaptive SC from 2, seats in turn"}
    return named


def max_samples(rule: Rule, n_agents: int, n_rounds: int, budget: int | None = None,
                per_round: int | None = None) -> int:
    """The most samples a debate under `rule` can draw (within the world's sample budgets: env.max_samples a debate,
    env.fresh_per_round a round)."""
    a_round = n_agents if rule.kinds == "fresh" else 1
    most = rule.start + (a_round if per_round is None else min(a_round, per_round)) * n_rounds
    return most if budget is None else min(most, budget)


def rule_grid(n_agents: int, n_rounds: int, bank_samples: int, budget: int | None = None,
              per_round: int | None = None) -> list[Rule]:
    """Every start width, round kind and stop whose debates fit in a question's `bank_samples` banked samples
    (within the sample budgets); a rule that stops at once is listed once per start width."""
    rules = []
    for start, kinds, agree in itertools.product(range(1, n_agents + 1), ("fresh-one", "fresh"),
                                                 (*range(1, n_agents + 1), None)):
        rule = Rule(start, kinds, agree)
        if (agree == 1 and kinds == "fresh") or \
                max_samples(rule, n_agents, n_rounds, budget, per_round) > bank_samples:
            continue  # stops before any fresh sample (the same as fresh-one), or would exhaust the bank
        rules.append(rule)
    return rules


def bank_samples(cfg: TrainConfig) -> int:
    """The fewest samples any question of the config's bank shelves holds (a debate may draw at most that many)."""
    from train.build import make_local_backend

    backend = make_local_backend(cfg)
    try:
        if not hasattr(backend, "bank"):
            raise ValueError(f"{PROG} needs a bank-world config (llm.preset: bank), got llm {cfg.llm.backend_spec()!r}")
        shelves = [backend.bank.shelf(k) for k in backend.keys]
        return min(min((len(v) for v in s.samples.values()), default=0) for s in shelves)
    finally:
        backend.close()


def shelf_samples(cfg: TrainConfig, split: str, style: str | None = None) -> dict[str, Samples]:
    """Each question's banked samples (answers, grades, tokens, confidence) on the shelf the world reads for `split`
    (in a pool that mixes reply modes, the shelf of `style`), cut to the fewest any question of the train shelf holds
    (the most a debate may draw)."""
    from train.build import make_local_backend

    def read(split: str) -> dict[str, Samples]:
        backend = make_local_backend(dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, split=split)))
        try:
            keys = [k for k in backend.keys if style is None or k.profile == style]
            if len(keys) != 1:
                raise ValueError(f"{PROG}: a rule replays one shelf{'' if style is None else ' of ' + style}; the "
                                 f"world reads {', '.join(k.name for k in backend.keys)}")
            shelf = backend.bank.shelf(keys[0])
            return {q: samples_of(shelf.of(q), RULE_SUMMARY) for q in shelf.questions}
        finally:
            backend.close()

    train = read(FIT)
    width = min(len(s.keys) for s in train.values())
    return {q: permuted(s, tuple(range(min(width, len(s.keys))))) for q, s in read(split).items()}


def fit_confidence_rules(cfg: TrainConfig, price: float, n_orders: int, seed: int) -> dict[str, RuleParams]:
    """CISC-3's tau and confident stop's threshold (at `price`) fitted by order-averaged replay on the `train/fit`
    questions alone (the questions DEAR trains on; dear.debate.replay_orders)."""
    fit = [ReplayQuestion.of(q, s, n_orders, seed) for q, s in shelf_samples(cfg, FIT).items() if not held_out(q)]
    tau = fit_tau(fit, 3).value
    threshold = fit_threshold(fit, lambda o: objective(o.score, o.tokens, price), RuleParams(tau=tau)).value
    return {"cisc-3": RuleParams(tau=tau), CONFIDENT_STOP: RuleParams(tau=tau, threshold=threshold)}


def replay_row(name: str, rule: str, params: RuleParams, samples: dict[str, Samples], questions: Sequence[str],
               price: float, n_orders: int, seed: int) -> Row:
    """A confidence rule on the same questions as the world's debates, each debate one seeded order of the question's
    banked samples (its k-th debate the k-th of `n_orders` orders, dear.debate.replay_orders): real samples, exactly
    as the rule reads them, no world in between."""
    seen: dict[str, int] = {}
    scores, tokens = [], []
    for q in questions:
        s = samples[q]
        order = orders(len(s.keys), n_orders, seed, q)[seen.get(q, 0) % n_orders]
        seen[q] = seen.get(q, 0) + 1
        out = rule_outcome(permuted(s, order), rule, params=params)
        scores.append(out.score)
        tokens.append(out.tokens)
    detail = f"{rule}: tau {params.tau:g}" + ("" if math.isinf(params.threshold) else
                                              f", threshold {params.threshold:.4g}")
    return Row(name, "rule", float(np.mean(scores)), float(np.mean(tokens)), math.nan, math.nan, math.nan, math.nan,
               len(scores), f"{detail} (replayed, fitted on {FIT})", scores,
               [objective(x, t, price) for x, t in zip(scores, tokens)])


def bank_row(name: str, kind: str, m: dict[str, float], eps: Sequence, cost: float, detail: str = "",
             cpu_s: float = 0.0) -> Row:
    """A row of real replayed samples (no synthetic label) from `evaluate`'s metrics and its debates."""
    return Row(name, kind, m["rollout/accuracy"], m["rollout/tokens_per_question"],
               m["rollout/completion_tokens_per_question"], math.nan, math.nan, m["rollout/mean_temperature"],
               int(m["rollout/episodes"]), detail, [float(e.final_score) for e in eps],
               [objective(e.final_score, e.tokens, cost) for e in eps], cpu_s)


def best_rule(base: TrainConfig, rules: Sequence[Rule], episodes: int, seed: int) -> tuple[Rule, list[dict]]:
    """The rule with the best objective on `train/fit` debates (ties: fewer tokens), and every rule's score."""
    scores = []
    for rule in rules:
        cfg = rule.config(base)
        m = evaluate(cfg, rule.policy(cfg), episodes, seed=seed, split=FIT)
        scores.append({"rule": rule.label, "key": rule.key, "accuracy": m["rollout/accuracy"],
                       "tokens_per_question": m["rollout/tokens_per_question"],
                       "objective": objective(m["rollout/accuracy"], m["rollout/tokens_per_question"],
                                              base.env.token_cost)})
        log.info("%s: fit accuracy %.3f, %.0f tokens, objective %.4f", rule.label, scores[-1]["accuracy"],
                 scores[-1]["tokens_per_question"], scores[-1]["objective"])
    best = max(zip(rules, scores), key=lambda rs: (rs[1]["objective"], -rs[1]["tokens_per_question"]))[0]
    return best, scores


def run_price(config: str, overrides: Sequence[str], price: float, seeds: Sequence[int], out: Path, episodes: int,
              eval_seed: int, select_episodes: int, split: str = HOLDOUT) -> list[dict]:
    """Every row of one price, resumable (module docstring); rows are evaluated on `split` (the held-out part of
    train, or `test` for the final evaluation on the test bank: nothing is fitted there)."""
    extra = [*overrides, f"env.token_cost={price}", "logging.progress=false"]
    base = load_config(config, extra)
    settings = {"config": config, "overrides": list(overrides), "token_cost": price, "episodes": episodes,
                "split": split,
                "eval_seed": eval_seed, "select_episodes": select_episodes, "llm": base.llm.backend_spec(),
                "resolved_config": json.loads(json.dumps(base.to_dict(), default=str))}
    run = CheckDir(out, settings)
    done = run.rows()

    def test(cfg: TrainConfig, policy: JointPolicy, eps: list) -> dict[str, float]:
        return evaluate(cfg, policy, episodes, seed=eval_seed, split=split, per_episode=eps)

    budgets = (base.env.max_samples, base.env.fresh_per_round)
    for rule, name in named_rules(base.env.n_agents, base.env.n_rounds, *budgets).items():
        if rule.key not in done:
            t0, eps = time.process_time(), []
            cfg = rule.config(base)
            m = test(cfg, rule.policy(cfg), eps)
            run.add(rule.key, bank_row(name, "rule", m, eps, price, rule.label, time.process_time() - t0),
                    questions=[e.question_id for e in eps])
    if "best-rule" not in done:
        t0, eps = time.process_time(), []
        grid = rule_grid(base.env.n_agents, base.env.n_rounds, bank_samples(base), *budgets)
        best, scores = best_rule(base, grid, select_episodes, eval_seed)
        cfg = best.config(base)
        m = test(cfg, best.policy(cfg), eps)
        run.add("best-rule", bank_row("best fixed rule", "best-fixed", m, eps, price, best.label,
                                      time.process_time() - t0), fit_scores=scores,
                questions=[e.question_id for e in eps])
    confidence_rows(base, price, split, run, done, eval_seed)
    mixing_rows(base, price, split, run, done, eval_seed)
    for seed in seeds:
        key = f"dear-{seed}"
        if key in done:
            continue
        t0, eps = time.process_time(), []
        cfg = load_config(config, [*extra, f"run.seed={seed}", f"run.out_dir={out / 'runs'}"])
        trainer = Trainer(cfg)
        try:
            result = trainer.train()
            m = test(cfg, trainer.policy, eps)
        finally:
            trainer.close()
        run.add(key, bank_row(f"DEAR, seed {seed}", "dear", m, eps, price, str(result.run_dir),
                              time.process_time() - t0), questions=[e.question_id for e in eps])
    rows = list(run.rows().values())
    write_table(out, rows, run.settings)
    return rows


CONFIDENCE_RULES = (("cisc-3", "CISC-3"), (CONFIDENT_STOP, "confident stop"))
REPLAY_ORDERS = 20


def confidence_rows(base: TrainConfig, price: float, split: str, run: CheckDir, done: dict, seed: int) -> None:
    """The confidence rules' rows (`replay_row`) on the questions of the rows already evaluated (a pool that mixes
    reply modes has none here: `mixing_rows` replays the fixed mixing rules over both modes instead)."""
    missing = [(rule, name) for rule, name in CONFIDENCE_RULES if f"replay-{rule}" not in done]
    reference = next((r for r in run.rows().values() if r.get("questions")), None)
    if not missing or reference is None:
        return
    styles = {p.style for p in base.env.profiles(base.llm.backend_spec()) or ()}
    if len(styles) > 1:  # a mixed pool's rule rows are mixing_rows'
        log.info("confidence rules left out: they replay one shelf, and the pool mixes %s", ", ".join(sorted(styles)))
        return
    t0 = time.process_time()
    params = fit_confidence_rules(base, price, REPLAY_ORDERS, seed)
    samples = shelf_samples(base, split)
    for rule, name in missing:
        row = replay_row(name, rule, params[rule], samples, reference["questions"], price, REPLAY_ORDERS, seed)
        run.add(f"replay-{rule}", dataclasses.replace(row, cpu_s=time.process_time() - t0),
                questions=reference["questions"])


MIXING_RULE = "adaptive-sc-2-from-2"  # the stop the mixed-mode policies learned: two answers agree


def mixing_rows(base: TrainConfig, price: float, split: str, run: CheckDir, done: dict, seed: int) -> None:
    """In a pool that mixes two reply modes, the fixed mixing rules (dear.debate.mode_mixing) beside the world's rows:
    adaptive SC (from 2, until 2 agree) over each mode alone and over every named schedule of the two, replayed on
    the same questions as the world's debates (a question's k-th debate reads the k-th seeded order of each mode's
    banked samples, as eval.mode_replay orders them), real samples and no world in between."""
    styles = list(dict.fromkeys(p.style for p in base.env.profiles(base.llm.backend_spec()) or ()))
    reference = next((r for r in run.rows().values() if r.get("questions")), None)
    if len(styles) != 2 or reference is None:
        return
    # (row key, name, schedule, mode): each mode alone, then every schedule (4 draws: the seats' turns differ at the 4th)
    specs = [(f"replay-mix-{mode}", f"{mode}: adaptive SC from 2", None, m) for m, mode in enumerate(styles)]
    specs += [(f"replay-mix-{name}", ", ".join(styles[i] for i in pattern(name, 4)) + ", ...: adaptive SC from 2",
               name, 0) for name in SCHEDULES]
    missing = [spec for spec in specs if spec[0] not in done]
    if not missing:
        return
    t0 = time.process_time()
    by_style = [shelf_samples(base, split, style) for style in styles]
    for key, name, schedule, mode in missing:
        seen: dict[str, int] = {}
        scores, tokens = [], []
        for q in reference["questions"]:
            k = seen.get(q, 0)
            seen[q] = k + 1
            samples = [shelf[q] for shelf in by_style]
            mode_orders = [orders(len(s.keys), REPLAY_ORDERS, seed, f"{q}/{style}")[k % REPLAY_ORDERS]
                           for s, style in zip(samples, styles)]
            out = rule_outcome(drawn(samples, mode_orders, schedule, mode), MIXING_RULE)
            scores.append(out.score)
            tokens.append(out.tokens)
        row = Row(name, "rule", float(np.mean(scores)), float(np.mean(tokens)), math.nan, math.nan, math.nan,
                  math.nan, len(scores), f"{MIXING_RULE} over {schedule or styles[mode] + ' alone'} (replayed)",
                  scores, [objective(x, t, price) for x, t in zip(scores, tokens)], time.process_time() - t0)
        run.add(key, row, questions=reference["questions"])


def by_question_difference(a: Sequence[float], b: Sequence[float], questions: Sequence[str],
                           seed: int = 0) -> tuple[float, float, float]:
    """Mean over questions of a question's mean (a - b) over its debates, with a 95 % bootstrap interval that
    resamples questions (debates of one question share its difficulty, so they are not independent)."""
    if len(a) != len(b) or len(a) != len(questions) or len(set(questions)) < 2:
        return math.nan, math.nan, math.nan
    per_question: dict[str, list[float]] = {}
    for x, y, q in zip(a, b, questions):
        per_question.setdefault(q, []).append(x - y)
    means = np.array([np.mean(v) for v in per_question.values()])
    if np.allclose(means, means[0]):
        return float(means.mean()), float(means.mean()), float(means.mean())
    ci = stats.bootstrap((means,), np.mean, confidence_level=0.95, n_resamples=2000, method="percentile",
                         random_state=np.random.default_rng(seed)).confidence_interval
    return float(means.mean()), float(ci.low), float(ci.high)


def write_table(out: Path, rows: Sequence[dict], settings: dict[str, Any]) -> str:
    cost = float(settings["token_cost"])
    split = settings.get("split", HOLDOUT)
    best = next((r for r in rows if r["kind"] == "best-fixed"), None)

    def fmt(x: float, d: int = 3) -> str:
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"

    lines = [f"## Price {cost:g} per 1,000 tokens", "",
             f"{settings['episodes']} debates on `{split}` (seed {settings['eval_seed']}), the same for every row "
             f"(each a question and a seeded order of its banked samples); the best fixed rule chosen on "
             f"{settings['select_episodes']} `{FIT}` debates. Objective = accuracy − {cost:g} × tokens / 1000. Real "
             f"replayed samples (`{settings['llm']}`); − best fixed rule: paired over the same debates, 95 % "
             f"bootstrap interval over questions.", "",
             "| policy | accuracy | tokens / question | objective | − best fixed rule [95 % CI] | rule / run |",
             "|---|---:|---:|---:|---|---|"]
    order = {"rule": 0, "best-fixed": 1, "dear": 2}
    for r in sorted(rows, key=lambda r: order.get(r["kind"], 3)):
        d, lo, hi = (by_question_difference(r.get("objectives") or [], best.get("objectives") or [],
                                            r.get("questions") or []) if best else (math.nan,) * 3)
        lines.append(f"| {r['name']} | {fmt(r['accuracy'])} | {fmt(r['tokens_per_question'], 0)} | "
                     f"{fmt(objective(r['accuracy'], r['tokens_per_question'], cost))} | {fmt(d)} [{fmt(lo)}, "
                     f"{fmt(hi)}] | {r['detail']} |")
    text = "\n".join(lines) + "\n"
    atomic_write_text(out / "table.md", text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="gsm8k", help="a bank-world train config (default gsm8k)")
    ap.add_argument("--prices", type=comma_list(float), default=(0.01, 0.05),
                    help="token prices (env.token_cost per 1,000 tokens), one check each (default 0.01,0.05)")
    ap.add_argument("--seeds", type=comma_list(int), default=(1,), help="training seeds of DEAR (default 1)")
    ap.add_argument("--out", type=Path, required=True, help="output directory (continued if it exists)")
    ap.add_argument("--episodes", type=int, default=256, help="debates per row (default 256)")
    ap.add_argument("--split", default=HOLDOUT,
                    help=f"where the rows are evaluated: {HOLDOUT} (default), or test for the final evaluation on the "
                         f"test bank (policies and rules are fitted on {FIT} only)")
    ap.add_argument("--eval-seed", type=int, default=99)
    ap.add_argument("--select-episodes", type=int, default=128, help="train/fit debates per rule of the grid")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. run.iterations=60")
    a = ap.parse_args(argv)
    if a.episodes < 1 or a.select_episodes < 1:
        ap.error("--episodes and --select-episodes must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    command = command_line(PROG, argv)
    parts = ["# Learning check in the bank world (real replayed samples)", "", f"Command: `{command}`", ""]
    for price in a.prices:
        run_price(a.config, a.overrides, price, a.seeds, a.out / f"price-{price:g}", a.episodes, a.eval_seed,
                  a.select_episodes, a.split)
        parts.append((a.out / f"price-{price:g}" / "table.md").read_text())
    atomic_write_text(a.out / "summary.md", "\n".join(parts))
    print("\n".join(parts))
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
