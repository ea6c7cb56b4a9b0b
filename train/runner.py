"""The training run: `Trainer` drives rollouts and HAPPO updates, checkpoints and logs, in one run directory.

The learner (`train.algorithm.HAPPO`) runs in the driver; rollouts run on the pool of `train.workers`. How failed
debates are excluded from an update and how run directories are used (new, `--overwrite`, `--resume`) is described
in the `train.happo` docstring, which is also the CLI's `--help`.
"""

from __future__ import annotations

import math
import shutil
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Sequence

import torch
import yaml

from dear.atomic import atomic_write_text, write_json
from dear.policy import Critic, JointPolicy
from dear.progress import ProgressSnapshot
from dear.regulator import state_dim
from dear.seeds import derive_seed
from train.algorithm import HAPPO
from train.buffer import RolloutBatch
from train.build import make_policy, settle_threads
from train.checkpoint import Counters, latest_checkpoint, load_checkpoint, save_checkpoint
from train.config import TrainConfig
from train.evaluate import summarize_episodes
from train.logger import RunLogger, read_metrics
from train.partial import PARTIAL_DIR, KeptWork, PartialIteration, call_log_spec, rollout_key
from train.workers import ChunkResult, RolloutReport, make_chunks, make_pool


class TrainingError(RuntimeError):
    """Training stopped (NaN in a loss or an observation); the last good checkpoint is kept."""


class AllDebatesFailed(TrainingError):
    """Every debate of an iteration failed (backend down?): no update, no checkpoint."""


class RunDirError(ValueError):
    """The run directory cannot be used as asked (an existing run without --overwrite, a file...)."""


# The progress line's ETA before the first debate of the run finishes: each agent turn that may call the model is
# expected to write (or, in a bank world, replay) this share of llm.max_tokens (a real gsm8k debate wrote ~0.7 of 384
# per turn; the measured tokens per debate replace the guess as soon as a debate finishes:
# dear.progress.LiveProgress).
EXPECTED_SHARE_OF_MAX_TOKENS = 0.6

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
    """Delete each path (a directory with its contents); a path that does not exist is skipped."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


@dataclass
class TrainResult:
    """How a run ended: its directory, counters, the last iteration's metrics, whether a signal stopped it."""

    run_dir: Path
    iterations: int
    global_step: int
    last_metrics: dict[str, float]
    interrupted: bool = False
    # An interrupted run's work of the iteration it was collecting, kept for --resume (None: it stopped after an
    # update, with nothing of the next iteration begun)
    kept: KeptWork | None = None


def expected_debate_tokens(cfg: TrainConfig) -> float:
    """Completion tokens one debate is expected to generate (or replay) before any has finished: every turn that may
    call the model, env.start_width agents in round 0 (all without it) and every agent in each later round, writes
    `EXPECTED_SHARE_OF_MAX_TOKENS` of llm.max_tokens."""
    turns = (cfg.env.start_width or cfg.env.n_agents) + cfg.env.n_agents * cfg.env.n_rounds
    return turns * cfg.llm.max_tokens * EXPECTED_SHARE_OF_MAX_TOKENS


def new_run_dir(cfg: TrainConfig) -> Path:
    """A fresh directory name under run.out_dir: NAME[-synthetic]-seedS-YYYYmmdd-HHMMSS[-k]."""
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
                 ray_address: str | None = None, progress: bool | None = None, overwrite: bool = False,
                 on_progress: Callable[[ProgressSnapshot], None] | None = None):
        """`progress`: show the progress display (default `logging.progress`); `on_progress` is called with
        every tick of it (debates done, tokens generated, elapsed), every few seconds while debates run."""
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
        # llama.cpp's thread count changes the texts a seed gives: fixed once, recorded in config.yaml, reused
        self.threads_note = settle_threads(cfg, resumed=resume)
        self.config_yaml = yaml.safe_dump(cfg.to_dict(), sort_keys=False)

        self.policy: JointPolicy = make_policy(cfg)
        self.critic = Critic(state_dim(cfg.env.n_agents), cfg.policy.critic_hidden)
        self.learner = HAPPO(self.policy, self.critic, cfg.happo, cfg.run.device)
        self.counters = Counters()
        self.last_good: Path | None = None
        self.resumed = resume
        self.kept_debates = 0  # finished debates of the interrupted iteration that --resume reuses
        self.kept_calls = 0  # logged model calls of its unfinished debates that --resume replays
        if resume:
            ckpt = latest_checkpoint(self.run_dir)
            if ckpt is None:
                raise FileNotFoundError(f"--resume {self.run_dir}: no checkpoint in {self.run_dir / 'checkpoints'}")
            self.counters, _ = load_checkpoint(ckpt, self.learner)
            self.last_good = ckpt
            read_metrics(self.run_dir / "metrics.jsonl")  # a damaged log is named now, before anything is written
            kept = self.kept_work()
            if kept is not None:
                self.kept_debates, self.kept_calls = kept.debates, kept.calls
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
                progress=cfg.logging.progress if progress is None else progress,
                debates_per_iteration=sum(len(c.env_seeds) for c in make_chunks(cfg, 0)),
                tokens=self.pool.generated_tokens, replayed=self.pool.replayed_tokens, listener=on_progress,
                expected_tokens_per_debate=expected_debate_tokens(cfg))
        except BaseException:
            self.pool.close()
            raise
        if stale:
            self.logger.write(f"--overwrite: removed the previous run's {', '.join(p.name for p in stale)}")
        self._in_update = False
        self._stop_requested = False
        self._t_start = time.perf_counter()
        self._steps_at_start = self.counters.global_step

    def kept_work(self) -> KeptWork | None:
        """What an interrupted attempt kept on disk of the next iteration (what `collect` will reuse: finished
        chunks and the logged calls of the others); None when the run has no iteration left."""
        it = self.counters.iteration
        if it >= self.cfg.run.iterations:
            return None
        partial = PartialIteration(self.run_dir, it, rollout_key(self.cfg, self.weights()))
        return partial.kept(make_chunks(self.cfg, it))

    def start_message(self) -> str:
        """The run's first line: where it runs, or where a resumed run continues and what it kept."""
        calls = (f", {self.kept_calls} model calls of unfinished ones replayed" if self.kept_calls else "")
        where = (f"resuming {self.run_dir} from iteration {self.counters.iteration}/{self.cfg.run.iterations} "
                 f"({self.kept_debates} finished debates kept{calls})" if self.resumed else f"run dir: {self.run_dir}")
        line = f"{where}  backend: {self.cfg.llm.backend_spec()}  workers: {self.cfg.rollout.num_workers}"
        return f"{line}\n{self.threads_note}" if self.threads_note else line

    def exit_lines(self, result: TrainResult, resume_command: str) -> list[str]:
        """What an interrupted run prints last: what it kept of the iteration it was collecting (or that it kept
        nothing of it) and the exact command that continues it. Nothing for a run that finished."""
        if not result.interrupted:
            return []
        lines = []
        it = result.iterations + 1
        # counted again: after close() no rollout worker is still appending a call
        kept = self.kept_work() if result.kept is not None else None
        if kept is not None and kept.empty:
            lines.append(f"stopped before any debate of iteration {it} finished and before any of its model calls "
                         f"returned: nothing of iteration {it} was kept; --resume starts it again")
        elif kept is not None:
            parts = []
            if kept.debates:
                parts.append(f"{kept.debates} finished debates ({kept.chunks} chunk{'s' if kept.chunks != 1 else ''})")
            if kept.calls:
                parts.append(f"{kept.calls} model calls ({kept.tokens:,} completion tokens) of its unfinished "
                             f"debates")
            lines.append(f"kept of iteration {it}: {' and '.join(parts)} in {kept.path}; --resume reuses them")
        lines.append(f"continue with: {resume_command}")
        return lines

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
        self.logger.debates_kept(n_kept)
        n_todo = sum(len(c.env_seeds) for c in todo)
        at_once = max(1, self.cfg.rollout.num_workers) * self.cfg.rollout.envs_per_worker  # debates one round runs
        self.logger.in_flight(min(n_todo, at_once))

        def progress(done: int, total: int) -> None:
            self.logger.rollout_progress(it, done + n_kept)
            self.logger.in_flight(min(n_todo - done, at_once))

        if hasattr(self.pool, "set_call_log"):  # a stop keeps the calls of the chunks still running
            self.pool.set_call_log(call_log_spec(partial))
        try:
            report = self.pool.collect(weights, todo, on_chunk=progress, on_result=partial.save)
        finally:
            self.logger.in_flight(0)
        fresh = {r.spec.index: r for r in report.results}
        return [kept.get(c.index) or fresh[c.index] for c in chunks], report

    def iteration(self) -> dict[str, float]:
        """Collect, drop failed debates (`train.happo` docstring), update; raises AllDebatesFailed with no update
        when none finished."""
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
        if cfg.happo.anneal_lr:  # from the iteration count alone, so a resumed run continues the same schedule
            self.learner.set_lr_fraction(1.0 - it / cfg.run.iterations)
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
        in_rollout = False  # stopped while the next iteration was being collected (not after an update)
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
                in_rollout = True
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
        write_json(self.run_dir / "summary.json", summary, indent=2, default=float)
        return TrainResult(self.run_dir, self.counters.iteration, self.counters.global_step, stats, interrupted,
                           kept=self.kept_work() if in_rollout else None)

    def close(self) -> None:
        self.logger.close()
        self.pool.close()
