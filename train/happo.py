"""HAPPO trainer for DEAR: `python -m train.happo --config gsm8k|smoke|sim|PATH.yaml [key.sub=value ...]`.

    python -m train.happo --config gsm8k                       # embedded Qwen on GSM8K train, local Ray
    python -m train.happo --config smoke                       # tiny real-model run (minutes)
    python -m train.happo --config sim run.iterations=50       # synthetic debaters (labelled synthetic)
    python -m train.happo --resume runs/RUN_DIR                # continue exactly where it stopped
    python -m train.happo --config gsm8k --ray-address auto    # join an existing Ray cluster

The learner (HAPPO update) runs in the driver; rollouts run on Ray actors (`rollout.num_workers`, 0 =
in-process). Every scalar goes to RUN_DIR/metrics.{csv,jsonl}; checkpoints to RUN_DIR/checkpoints/.

Failed debates. A debate fails when one of its LLM requests fails after the backend's retries
(`Completion.error`); the engine ends it there. It is *excluded from the update*: its whole row of transitions
is dropped from the iteration's batch, so its reward (a failed debate would count as wrong) and its partial
rounds reach neither the advantages, the value targets nor the value normaliser, and the rollout metrics
(accuracy, reward, tokens, HCR/BCR) are computed over the finished debates only. `rollout/failed_debates`
counts the excluded debates of the iteration (`charts/failed_debates_total` over the run). An iteration in
which every debate failed makes no update and writes no checkpoint: training stops with exit code 1 and one
error line that names the backend.

Run directories. `--run-dir` of an existing run refuses unless `--overwrite` (which first removes the old
run's checkpoints, partial chunks and logs); `--resume RUN_DIR` continues a run (with dotted overrides only,
never `--config`) and changes nothing on disk until its checkpoint loaded and its backend started. Debates
finished in an interrupted iteration are kept in RUN_DIR/partial/ (train/partial.py) and reused by `--resume`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import yaml

from dear.cli import run as run_cli
from dear.integrity import IntegrityError, atomic_write_text
from dear.llm.base import BackendError
from dear.policy import Critic, JointPolicy
from dear.regulator import state_dim
from dear.seeds import derive_seed
from train.algorithm import HAPPO
from train.buffer import RolloutBatch
from train.build import make_policy
from train.checkpoint import Counters, latest_checkpoint, load_checkpoint, save_checkpoint
from train.config import (
    ConfigError,
    TrainConfig,
    apply_overrides,
    config_from_dict,
    help_epilog,
    load_config,
    rename_deprecated_keys,
)
from train.logger import RunLogger, read_metrics
from train.partial import PARTIAL_DIR, PartialIteration, rollout_key
from train.workers import (
    ChunkResult,
    ChunkSpec,
    EpisodeStats,
    LocalPool,
    RolloutReport,
    make_chunks,
    make_pool,
    run_chunk,
)


class TrainingError(RuntimeError):
    """Training stopped (NaN in a loss or an observation); the last good checkpoint is kept."""


class AllDebatesFailed(TrainingError):
    """Every debate of an iteration failed (backend down?): no update, no checkpoint."""


class RunDirError(ValueError):
    """The run directory cannot be used as asked (an existing run without --overwrite, a file...)."""


# What a run writes into its directory; `--overwrite` removes exactly these before a new run starts.
RUN_ARTIFACTS = ("checkpoints", PARTIAL_DIR, "metrics.jsonl", "metrics.csv", "summary.json", "config.yaml", "wandb")


def check_new_run_dir(run_dir: Path, overwrite: bool) -> list[Path]:
    """Refuse a run directory that holds another run (unless `overwrite`) or is a file; returns the old run's
    artifacts that `--overwrite` will remove. Nothing is changed here."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--run-dir {run_dir}: exists and is not a directory")
    old = [run_dir / name for name in RUN_ARTIFACTS if (run_dir / name).exists()]
    if old and not overwrite:
        raise RunDirError(f"--run-dir {run_dir}: already holds a run ({', '.join(p.name for p in old)}); continue it "
                          f"with --resume {run_dir}, or pass --overwrite to replace it")
    return old


def remove_paths(paths: Sequence[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


@dataclass
class TrainResult:
    run_dir: Path
    iterations: int
    global_step: int
    last_metrics: dict[str, float]
    interrupted: bool = False


def summarize_episodes(all_episodes: Sequence[EpisodeStats]) -> dict[str, float]:
    """Rollout metrics of a set of debates (pooled HCR/BCR: sum of numerators / sum of denominators).

    Computed over the finished debates; failed ones are only counted (`rollout/failed_debates`)."""
    if not all_episodes:
        return {}
    episodes = [e for e in all_episodes if not e.failed]
    n_failed = len(all_episodes) - len(episodes)

    def mean(xs):
        xs = [x for x in xs if not (isinstance(x, float) and math.isnan(x))]
        return float(np.mean(xs)) if xs else math.nan

    hcr_den, bcr_den = sum(e.hcr_den for e in episodes), sum(e.bcr_den for e in episodes)
    return {
        "rollout/reward": mean([e.episode_return for e in episodes]),
        "rollout/reward_correct": mean([e.reward_correct for e in episodes]),
        "rollout/reward_tokens": mean([e.reward_tokens for e in episodes]),
        "rollout/accuracy": mean([e.final_score for e in episodes]),
        "rollout/round0_accuracy": mean([e.round0_accuracy for e in episodes]),
        "rollout/round0_tokens_per_question": mean([e.round0_tokens for e in episodes]),
        "rollout/tokens_per_question": mean([e.tokens for e in episodes]),
        "rollout/prompt_tokens_per_question": mean([e.prompt_tokens for e in episodes]),
        "rollout/completion_tokens_per_question": mean([e.completion_tokens for e in episodes]),
        "rollout/hcr": sum(e.hcr_num for e in episodes) / hcr_den if hcr_den else math.nan,
        "rollout/hcr_cases": float(hcr_den),
        "rollout/bcr": sum(e.bcr_num for e in episodes) / bcr_den if bcr_den else math.nan,
        "rollout/bcr_cases": float(bcr_den),
        "rollout/tie_rate": mean([float(e.tie) for e in episodes]),
        "rollout/failed_debates": float(n_failed),
        "rollout/mean_temperature": mean([e.mean_temperature for e in episodes]),
        "rollout/mean_top_p": mean([e.mean_top_p for e in episodes]),
        "rollout/mask_density": mean([e.mask_density for e in episodes]),
        "rollout/episodes": float(len(episodes)),
    }


def new_run_dir(cfg: TrainConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    tag = "-synthetic" if cfg.llm.synthetic else ""
    base = Path(cfg.run.out_dir) / f"{cfg.run.name}{tag}-seed{cfg.run.seed}-{stamp}"
    path, k = base, 1
    while path.exists():
        path, k = Path(f"{base}-{k}"), k + 1
    return path


class Trainer:
    """One training run. Construction checks everything (run directory, checkpoint, backend) before it writes
    anything, so a refused start or a failed `--resume` leaves the run directory exactly as it was."""

    def __init__(self, cfg: TrainConfig, run_dir: Path | None = None, resume: bool = False,
                 ray_address: str | None = None, progress: bool | None = None, overwrite: bool = False):
        self.cfg = cfg
        torch.set_num_threads(max(1, cfg.run.torch_threads))
        self.synthetic = cfg.llm.synthetic
        stale: list[Path] = []
        if resume:
            if run_dir is None:
                raise ValueError("resume needs a run directory")
            if overwrite:
                raise RunDirError("--resume continues a run; it cannot be combined with --overwrite")
            self.run_dir = Path(run_dir)
        else:
            self.run_dir = Path(run_dir) if run_dir is not None else new_run_dir(cfg)
            stale = check_new_run_dir(self.run_dir, overwrite)
        self.config_yaml = yaml.safe_dump(cfg.to_dict(), sort_keys=False)

        self.policy: JointPolicy = make_policy(cfg)
        self.critic = Critic(state_dim(cfg.env.n_agents), cfg.policy.critic_hidden)
        self.learner = HAPPO(self.policy, self.critic, cfg.happo, cfg.run.device)
        self.counters = Counters()
        self.last_good: Path | None = None
        if resume:
            ckpt = latest_checkpoint(self.run_dir)
            if ckpt is None:
                raise FileNotFoundError(f"--resume {self.run_dir}: no checkpoint in {self.run_dir / 'checkpoints'}")
            self.counters, _ = load_checkpoint(ckpt, self.learner)
            self.last_good = ckpt
            read_metrics(self.run_dir / "metrics.jsonl")  # a damaged log is named now, before anything is written
        self.pool = make_pool(cfg, ray_address)
        try:
            if getattr(self.pool, "synthetic", self.synthetic) != self.synthetic:
                raise ValueError(f"backend synthetic={self.pool.synthetic} but config says {self.synthetic}")
            # Everything checked: from here on the run directory changes.
            remove_paths(stale)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.run_dir / "config.yaml", self.config_yaml)
            self.logger = RunLogger(
                self.run_dir, self.synthetic, cfg.run.iterations, start_iteration=self.counters.iteration,
                use_wandb=cfg.logging.wandb, wandb_project=cfg.logging.wandb_project, config=cfg.to_dict(),
                progress=cfg.logging.progress if progress is None else progress)
        except BaseException:
            self.pool.close()
            raise
        if stale:
            self.logger.write(f"--overwrite: removed the previous run's {', '.join(p.name for p in stale)}")
        self._in_update = False
        self._stop_requested = False
        self._t_start = time.perf_counter()
        self._steps_at_start = self.counters.global_step

    # -- signals -----------------------------------------------------------------------------------
    def _on_signal(self, signum, frame):
        if self._stop_requested:  # second signal: stop now
            raise KeyboardInterrupt
        self._stop_requested = True
        if not self._in_update:
            raise KeyboardInterrupt  # abandon the half-collected rollout; state = last finished iteration
        self.logger.write(f"signal {signum}: finishing the current update, then checkpointing")

    def checkpoint(self) -> Path:
        path = save_checkpoint(self.run_dir, self.learner, self.counters, self.config_yaml,
                               extra={"synthetic": self.synthetic})
        self.last_good = path
        return path

    # -- one iteration -----------------------------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()}

    def collect(self, it: int) -> tuple[list[ChunkResult], RolloutReport]:
        """The iteration's chunks: those kept on disk by an interrupted attempt (same weights, same specs) plus
        freshly collected ones, each kept on disk as soon as it finishes (train/partial.py)."""
        weights = self.weights()
        chunks = make_chunks(self.cfg, it)
        partial = PartialIteration(self.run_dir, it, rollout_key(self.cfg, weights))
        kept = partial.load(chunks)
        if kept:
            n = sum(len(r.episodes) for r in kept.values())
            self.logger.write(f"iteration {it + 1}: reusing {n} finished debates ({len(kept)} chunks) "
                              f"kept in {partial.path}")
        todo = [c for c in chunks if c.index not in kept]
        n_kept = sum(len(c.env_seeds) for c in chunks) - sum(len(c.env_seeds) for c in todo)

        def progress(done: int, total: int) -> None:
            self.logger.rollout_progress(done + n_kept, total + n_kept)

        report = self.pool.collect(weights, todo, on_chunk=progress, on_result=partial.save)
        fresh = {r.spec.index: r for r in report.results}
        return [kept.get(c.index) or fresh[c.index] for c in chunks], report

    def iteration(self) -> dict[str, float]:
        """Collect, drop failed debates (module docstring), update; raises AllDebatesFailed with no update when
        none finished."""
        cfg = self.cfg
        it = self.counters.iteration
        t0 = time.perf_counter()
        results, report = self.collect(it)
        episodes = [e for r in results for e in r.episodes]
        failed = torch.tensor([e.failed for e in episodes], dtype=torch.bool)
        if failed.all():
            first = next((e.error for e in episodes if e.error), "no error text")
            raise AllDebatesFailed(
                f"iteration {it + 1}: all {len(episodes)} debates failed on backend '{cfg.llm.backend_spec()}' "
                f"(first error: {first}); no update was made and no checkpoint written")
        batch = RolloutBatch.concat([r.batch for r in results]).select(~failed)
        t_rollout = time.perf_counter() - t0
        try:
            batch.check_finite()
        except FloatingPointError as e:
            raise TrainingError(f"iteration {it}: {e}") from e
        gen = torch.Generator().manual_seed(derive_seed(cfg.run.seed, it, 1_000_003, bits=62))
        self._in_update = True
        try:
            stats = self.learner.update(batch, gen)
        except FloatingPointError as e:
            raise TrainingError(f"iteration {it}: {e}") from e
        n_steps = batch.rewards.numel()
        self.counters.iteration += 1
        self.counters.global_step += n_steps
        self.counters.episodes += batch.num_episodes
        self.counters.worker_restarts += report.worker_restarts
        self.counters.episodes_redone += report.episodes_redone
        self.counters.tokens += int(sum(e.tokens for e in episodes))
        self.counters.failed_episodes += int(failed.sum())
        self._in_update = False
        PartialIteration(self.run_dir, it, "").clear()  # its debates are in the update now
        t_total = time.perf_counter() - t0
        elapsed = time.perf_counter() - self._t_start
        llm_s = sum(r.llm_time_s for r in results)
        env_s = sum(r.env_time_s for r in results)
        stats.update(summarize_episodes(episodes))
        stats.update({
            "charts/SPS": (self.counters.global_step - self._steps_at_start) / max(elapsed, 1e-9),
            "charts/iteration_SPS": n_steps / max(t_total, 1e-9),
            "charts/episodes": float(self.counters.episodes),
            "charts/learning_rate_selection": self.learner.optimizers["selection"].param_groups[0]["lr"],
            "charts/learning_rate_behavior": self.learner.optimizers["behavior"].param_groups[0]["lr"],
            "charts/worker_restarts": float(self.counters.worker_restarts),
            "charts/episodes_redone": float(self.counters.episodes_redone),
            "charts/failed_debates_total": float(self.counters.failed_episodes),
            "time/iteration_s": t_total,
            "time/rollout_s": t_rollout,
            "time/update_s": t_total - t_rollout,
            "time/llm_share_of_env": llm_s / env_s if env_s > 0 and not math.isnan(llm_s) else math.nan,
            # LLM time per worker (workers run in parallel) over the whole iteration, rollout + update.
            "time/llm_share_of_iteration": (llm_s / max(1, cfg.rollout.num_workers)) / t_total
            if not math.isnan(llm_s) else math.nan,
        })
        return stats

    def train(self) -> TrainResult:
        cfg = self.cfg
        old_int = signal.signal(signal.SIGINT, self._on_signal)
        old_term = signal.signal(signal.SIGTERM, self._on_signal)
        stats: dict[str, float] = {}
        interrupted = False
        try:
            while self.counters.iteration < cfg.run.iterations:
                stats = self.iteration()
                self.logger.log(self.counters.iteration, self.counters.global_step, stats)
                self.logger.progress(self.counters.iteration, stats["charts/SPS"], stats["rollout/reward"],
                                     stats["rollout/accuracy"])
                if not all(math.isfinite(v) for k, v in stats.items() if k.startswith("losses/") and k !=
                           "losses/explained_variance" and isinstance(v, float)):
                    bad = [k for k, v in stats.items() if k.startswith("losses/") and isinstance(v, float)
                           and not math.isfinite(v) and k != "losses/explained_variance"]
                    raise TrainingError(f"iteration {self.counters.iteration}: non-finite losses {bad}")
                if (self.counters.iteration % cfg.run.checkpoint_every == 0
                        or self.counters.iteration == cfg.run.iterations or self._stop_requested):
                    self.checkpoint()
                if self._stop_requested:
                    interrupted = True
                    break
        except KeyboardInterrupt:
            interrupted = True
            if not self._in_update:
                path = self.checkpoint()
                self.logger.write(f"interrupted: checkpoint of iteration {self.counters.iteration} at {path}")
        except TrainingError as e:
            where = self.last_good or "none (no checkpoint was written yet)"
            raise TrainingError(f"{e}. Training stopped; last good checkpoint: {where}") from e
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
        summary = {"iterations": self.counters.iteration, "global_step": self.counters.global_step,
                   "interrupted": interrupted, "synthetic": self.synthetic,
                   "last_checkpoint": str(self.last_good) if self.last_good else None,
                   "metrics": {self.logger.name(k): v for k, v in stats.items()}}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        return TrainResult(self.run_dir, self.counters.iteration, self.counters.global_step, stats, interrupted)

    def close(self) -> None:
        self.logger.close()
        self.pool.close()


# ---------------------------------------------------------------------------------------------------
# Evaluation of a policy on fixed seeded debates (used by the learning check and the bench)


def evaluate(cfg: TrainConfig, policy: JointPolicy, episodes: int, seed: int, deterministic: bool = True,
             split: str | None = None, per_episode: list[EpisodeStats] | None = None) -> dict[str, float]:
    """Run `episodes` debates in-process under `policy`; same (cfg, episodes, seed, split) = same debates.
    `per_episode`, if given, receives each debate's EpisodeStats in order (for paired comparisons)."""
    if next(policy.parameters()).device.type != "cpu":
        policy = copy.deepcopy(policy).cpu()  # rollouts run on CPU; the learner's policy may be on run.device
    ecfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, split=split or cfg.env.split),
                               rollout=dataclasses.replace(cfg.rollout, num_workers=0))
    pool = LocalPool(ecfg)
    try:
        n = ecfg.rollout.envs_per_worker
        eps: list[EpisodeStats] = []
        for c in range(math.ceil(episodes / n)):
            rng = np.random.default_rng(derive_seed(seed, 7_777_777, c, bits=62))
            spec = ChunkSpec(iteration=-1, index=c, env_seeds=tuple(int(s) for s in rng.integers(0, 2**31 - 1, n)),
                             torch_seed=int(rng.integers(0, 2**62)))
            eps += run_chunk(pool.worker.venv, policy, spec, ecfg.env.n_rounds, deterministic).episodes
        if per_episode is not None:
            per_episode.extend(eps[:episodes])
        return summarize_episodes(eps[:episodes])
    finally:
        pool.close()


def mad_policy(cfg: TrainConfig) -> JointPolicy:
    """The MAD baseline in the policy slot: full mask, fixed sampling (policy.fixed_temperature/top_p)."""
    mcfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, selection_mode="full",
                                                               behavior_mode="fixed"))
    return make_policy(mcfg)


# ---------------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m train.happo", description=__doc__, epilog=help_epilog(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="show the traceback of an error")
    p.add_argument("--config", help="gsm8k | smoke | sim | path/to/config.yaml")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    p.add_argument("--ray-address", default=None, help="join an existing Ray cluster (e.g. 'auto' or host:port)")
    p.add_argument("--run-dir", default=None, help="explicit run directory (default: run.out_dir/NAME-...)")
    p.add_argument("--overwrite", action="store_true",
                   help="allow --run-dir to name an existing run: its checkpoints and logs are removed first")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.episodes_per_iter=8")
    args = p.parse_args(argv)
    if not args.config and not args.resume:
        p.error("give --config NAME_OR_PATH or --resume RUN_DIR")
    if args.config and args.resume:
        p.error("--config cannot be combined with --resume: a resumed run keeps its own config.yaml "
                "(change single keys with dotted overrides, e.g. run.iterations=400)")
    if args.resume and (args.run_dir or args.overwrite):
        p.error("--resume RUN_DIR names the run directory; it cannot be combined with --run-dir or --overwrite")
    return args


def build_config(args: argparse.Namespace) -> TrainConfig:
    if args.resume:
        saved = Path(args.resume) / "config.yaml"
        if not Path(args.resume).is_dir():
            raise FileNotFoundError(f"--resume {args.resume}: no such run directory")
        if not saved.exists():
            raise FileNotFoundError(f"--resume {args.resume}: no config.yaml in the run directory")
        try:
            data = yaml.safe_load(saved.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise ConfigError(f"{saved}: cannot be parsed (damaged?): {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{saved}: top level must be a mapping")
        data = rename_deprecated_keys(data, f"{saved}: ")  # a run saved before a key was renamed
        data = apply_overrides(data, list(args.overrides))  # e.g. run.iterations=400 to extend a run
        return config_from_dict(data, f"{saved}: ")
    return load_config(args.config, list(args.overrides))


# Errors at start-up (bad input, damaged files, backend unreachable): one line on stderr, exit code 2.
START_ERRORS = (ConfigError, RunDirError, IntegrityError, FileNotFoundError, BackendError)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = build_config(args)
        trainer = Trainer(cfg, run_dir=Path(args.resume or args.run_dir) if (args.resume or args.run_dir) else None,
                          resume=bool(args.resume), ray_address=args.ray_address, overwrite=args.overwrite)
    except START_ERRORS as e:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 2
    trainer.logger.write(f"run dir: {trainer.run_dir}  backend: {cfg.llm.backend_spec()}  "
                         f"workers: {cfg.rollout.num_workers}  start iteration: {trainer.counters.iteration}")
    try:
        result = trainer.train()
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        trainer.close()
    trainer.logger.write(f"done: {result.iterations} iterations, {result.global_step} env steps"
                         f"{' (interrupted)' if result.interrupted else ''}; run dir {result.run_dir}")
    return 130 if result.interrupted else 0


if __name__ == "__main__":
    run_cli(main, "python -m train.happo")
