"""Rollout collection: in-process or on Ray actors, with the LLM engine as a shared Ray actor. The policy,
backend and env each worker runs are built by `train.build`; the config reaches every worker once, as the
`TrainConfig` itself.

Work unit = a *chunk*: one vector env batch of `envs_per_worker` debates run for R steps. Each chunk's
randomness (the sub-debates' env seeds and the torch seed of policy sampling) is derived from
(run seed, iteration, chunk index) only, so results do not depend on the number of workers, on which
worker ran a chunk, or on whether a chunk was redone after a worker died; this is also what makes a
resumed run identical to an uninterrupted one.

The trainer talks to engines only through the `Backend` interface: a `RemoteBackend` proxy forwards
`generate()` to the `LLMEngine` actor that owns the real backend.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dear.llm.base import GENERATED_TOKENS, REPLAYED_TOKENS, Backend, ChatRequest, Completion
from dear.metrics import conformity, round_vote
from dear.policy import JointPolicy
from dear.seeds import derive_seed
from envs.debate_env import EpisodeSummary
from train.build import TimedBackend, make_local_backend, make_policy, make_vector_env
from train.buffer import EXTENDED_FIELDS, RolloutBatch
from train.call_log import CallLog, CallLogSpec
from train.config import TrainConfig


# ---------------------------------------------------------------------------------------------------
# Specs and results (typed, never positional tuples)


@dataclass(frozen=True)
class ChunkSpec:
    iteration: int
    index: int  # chunk index within the iteration
    env_seeds: tuple[int, ...]  # one per sub-debate
    torch_seed: int


@dataclass
class EpisodeStats:
    question_id: str
    final_correct: bool  # the seeded tie pick
    final_score: float  # ties as expected values: the accuracy statistics use this
    episode_return: float
    reward_correct: float
    reward_tokens: float
    tokens: int
    prompt_tokens: int
    completion_tokens: int
    tie: bool
    failed: bool
    hcr_num: int
    hcr_den: int
    bcr_num: int
    bcr_den: int
    round0_accuracy: float  # plurality of round 0 (for "did the debate help")
    mean_temperature: float
    mean_top_p: float
    mask_density: float
    error: str | None = None  # why the debate failed (a backend request gave up), None when it finished
    round0_tokens: int = 0  # prompt + completion tokens of round 0 alone (0 in partial chunks saved before it existed)
    # Extended actions: shares of exchange-round turns that drew a fresh sample / kept their answer, exchange
    # rounds run, and whether the debate stopped before its last round (nan / -1 / False in older chunks).
    fresh_share: float = math.nan
    keep_share: float = math.nan
    rounds_run: int = -1
    stopped: bool = False


@dataclass
class ChunkResult:
    spec: ChunkSpec
    batch: RolloutBatch
    episodes: list[EpisodeStats]
    env_time_s: float  # wall time of the chunk
    llm_time_s: float  # time inside backend.generate


def make_chunks(cfg: TrainConfig, iteration: int) -> list[ChunkSpec]:
    """The iteration's chunks; with rollout.group_size G, each env seed appears G times in a row (a group: the
    same question and debate seed)."""
    n, g = cfg.rollout.envs_per_worker, cfg.rollout.group_size
    count = math.ceil(cfg.rollout.episodes_per_iter / n)
    chunks = []
    for c in range(count):
        base = derive_seed(cfg.run.seed, iteration, c, bits=62)
        rng = np.random.default_rng(base)
        seeds = np.repeat(rng.integers(0, 2**31 - 1, size=n // g), g)
        chunks.append(ChunkSpec(iteration=iteration, index=c, env_seeds=tuple(int(s) for s in seeds),
                                torch_seed=int(rng.integers(0, 2**62))))
    return chunks


def group_ids(spec: ChunkSpec) -> torch.Tensor:
    """(E,) group id of each of the chunk's debates: debates with the same env seed share one (unique across
    an iteration's chunks)."""
    first = {s: k for k, s in reversed(list(enumerate(spec.env_seeds)))}
    n = len(spec.env_seeds)
    return torch.tensor([spec.index * n + first[s] for s in spec.env_seeds], dtype=torch.float32)


# ---------------------------------------------------------------------------------------------------
# One chunk


def _episode_stats(info: dict[str, Any], k: int) -> EpisodeStats:
    """Training statistics of debate `k` from its terminal info (reward parts plus its `EpisodeSummary`)."""
    ep: EpisodeSummary = info["episode"][k]
    answers = [list(a) for a in ep.answers_per_round]
    correct = [[bool(c) for c in row] for row in ep.correct_per_round]
    conf = conformity(answers, correct)
    v = len(correct[0])
    masks = np.asarray(ep.masks_per_round, dtype=float)
    exchanged = masks.shape[0] - 1  # rounds after round 0
    density = float(masks[1:].sum() / (exchanged * v * (v - 1))) if exchanged > 0 else math.nan
    temps, tops = ep.temperature_per_round[1:], ep.top_p_per_round[1:]
    return EpisodeStats(
        question_id=ep.question_id, final_correct=ep.final_correct, final_score=ep.final_score,
        episode_return=float(info["episode_return"][k]), reward_correct=float(info["reward_correct"][k]),
        reward_tokens=float(info["reward_tokens"][k]), tokens=ep.tokens_total, prompt_tokens=ep.prompt_tokens,
        completion_tokens=ep.completion_tokens, tie=ep.tie, failed=ep.failed,
        hcr_num=conf.hcr.num, hcr_den=conf.hcr.den, bcr_num=conf.bcr.num, bcr_den=conf.bcr.den,
        round0_accuracy=round_vote(answers[0], correct[0]).score,
        round0_tokens=sum(t.prompt_tokens + t.completion_tokens for t in ep.trace.rounds[0]),
        mean_temperature=float(np.mean(temps)) if temps.size else math.nan,
        mean_top_p=float(np.mean(tops)) if tops.size else math.nan, mask_density=density, error=ep.error,
        **_turn_kind_stats(ep),
    )


def _turn_kind_stats(ep: EpisodeSummary) -> dict[str, Any]:
    later = [t for turns in ep.trace.rounds[1:] for t in turns]
    n = len(later)
    rounds_run = len(ep.trace.rounds) - 1
    return dict(
        fresh_share=sum(t.fresh for t in later) / n if n else math.nan,
        keep_share=sum(t.silent for t in later) / n if n else math.nan,
        rounds_run=rounds_run,
        stopped=bool(not ep.failed and rounds_run < ep.planned_rounds),
    )


def run_chunk(venv, policy: JointPolicy, spec: ChunkSpec, n_steps: int, deterministic: bool = False) -> ChunkResult:
    """Run `venv.num_envs` debates of `n_steps` rounds under `policy`.

    Every debate ends at the last step, except one that failed (a backend request gave up): it ends early,
    the vector env carries it along as a no-op, and its `EpisodeStats.failed` is set. Its rows stay in the
    batch (a dense (E, T) grid); the trainer drops them before the update (see `train.happo`).
    The global torch RNG is left as it was (policy sampling runs on a fork seeded by the chunk), so a
    collection in the driver process does not depend on which chunks ran there.
    """
    with torch.random.fork_rng(devices=[]):
        return _run_chunk(venv, policy, spec, n_steps, deterministic)


def _run_chunk(venv, policy: JointPolicy, spec: ChunkSpec, n_steps: int, deterministic: bool) -> ChunkResult:
    t0 = time.perf_counter()
    timed = venv.core.backend if isinstance(venv.core.backend, TimedBackend) else None
    llm0 = timed.seconds if timed else 0.0
    torch.manual_seed(spec.torch_seed)
    obs, _ = venv.reset(seed=list(spec.env_seeds))
    extended = policy.extended
    rec: dict[str, list[torch.Tensor]] = {k: [] for k in (
        "selection_obs", "pairs", "behavior_obs", "raw_behavior", "logp_selection", "logp_behavior", "state",
        "rewards", "dones", *(EXTENDED_FIELDS if extended else ()))}
    terminal: list[tuple[dict[str, Any], int] | None] = [None] * venv.num_envs  # (infos, k) of each debate's end
    ended = np.zeros(venv.num_envs, dtype=bool)
    for t in range(n_steps):
        for key in ("selection", "belief", "uncertainty", "state"):
            if not np.isfinite(obs[key]).all():
                raise FloatingPointError(f"non-finite observation '{key}' in chunk {spec.index} step {t}")
        act = policy.act(torch.from_numpy(obs["selection"]), torch.from_numpy(obs["belief"]),
                         torch.from_numpy(obs["uncertainty"]), deterministic=deterministic)
        rec["selection_obs"].append(torch.from_numpy(obs["selection"]))
        rec["state"].append(torch.from_numpy(obs["state"]))
        rec["pairs"].append(act.pairs)
        rec["behavior_obs"].append(act.behavior_obs)
        rec["raw_behavior"].append(act.raw_behavior)
        rec["logp_selection"].append(act.logp_selection)
        rec["logp_behavior"].append(act.logp_behavior)
        if extended:
            rec["kinds"].append(act.kinds.to(torch.float32))
            rec["stop"].append(act.stop)
            rec["behavior_active"].append(act.behavior_active)
            rec["valid"].append(torch.as_tensor(~ended, dtype=torch.float32))
        obs, rewards, terms, truncs, infos = venv.step(act.env_action())
        done = np.logical_or(terms, truncs)
        failed = np.asarray(infos.get("failed", np.zeros(venv.num_envs, bool)), dtype=bool)
        last = t == n_steps - 1
        early = done & ~failed & ~ended
        if (not last and early.any() and not extended) or (last and not done.all()):
            raise RuntimeError(f"debates that did not fail must all end after exactly {n_steps} rounds; got "
                               f"done={done.tolist()} failed={failed.tolist()} at step {t}")
        ended |= done
        for k in np.flatnonzero(done):
            if terminal[k] is None:
                terminal[k] = (infos, int(k))
        rec["rewards"].append(torch.as_tensor(rewards, dtype=torch.float32))
        rec["dones"].append(torch.as_tensor(done, dtype=torch.float32))
    batch = RolloutBatch(**{k: torch.stack(v, 1).to(torch.float32) for k, v in rec.items()}, group=group_ids(spec))
    # A stopped debate rides along as a no-op: its later rewards are 0 and its steps are not valid.
    episodes = [_episode_stats(*end) for end in terminal if end is not None]
    llm = (timed.seconds - llm0) if timed else math.nan
    return ChunkResult(spec=spec, batch=batch, episodes=episodes, env_time_s=time.perf_counter() - t0, llm_time_s=llm)


# ---------------------------------------------------------------------------------------------------
# Workers


class RolloutWorker:
    """Owns a vector env and a copy of the actors; the Ray actor class wraps this same class."""

    def __init__(self, cfg: TrainConfig, worker_index: int, engine=None):
        self.cfg = cfg
        torch.set_num_threads(1)
        self.index = worker_index
        self.policy = make_policy(self.cfg)
        backend = RemoteBackend(engine) if engine is not None else make_local_backend(self.cfg)
        self.engine_info = backend.info if isinstance(backend, RemoteBackend) else None
        self.calls = CallLog(backend)  # logs each chunk's calls as they return; replays them after a stop
        self.backend = TimedBackend(self.calls)
        self.venv = make_vector_env(self.cfg, self.backend)

    def pid(self) -> int:
        return os.getpid()

    def engine(self) -> dict[str, Any] | None:
        """The info of the LLM engine actor this worker sends its requests to (None: an in-worker backend)."""
        return self.engine_info

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.policy.load_state_dict(weights)

    def rollout(self, weights: dict[str, torch.Tensor] | None, chunks: list[ChunkSpec],
                deterministic: bool = False, calls: CallLogSpec | None = None) -> list[ChunkResult]:
        """Run `chunks`; with `calls`, each chunk's model calls are logged there and a logged call is replayed
        (train/call_log.py)."""
        if weights is not None:
            self.set_weights(weights)
        results = []
        for c in chunks:
            self.calls.begin(calls, c.index)
            try:
                results.append(run_chunk(self.venv, self.policy, c, self.cfg.env.n_rounds, deterministic))
            finally:
                self.calls.end()
        return results

    def close(self) -> None:
        self.venv.close()


class LLMEngine:
    """Owns one real backend (llama.cpp / vLLM / HTTP client / sim); shared by the rollout workers."""

    def __init__(self, cfg: TrainConfig):
        self.backend = make_local_backend(cfg)

    def info(self) -> dict[str, Any]:
        b = self.backend
        return {"model_id": b.model_id, "synthetic": bool(b.synthetic), "context_length": b.context_length,
                "node": os.uname().nodename, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        return self.backend.generate(requests)

    def generated_tokens(self) -> int:
        """Tokens generated in this actor so far, counted as they come back (`GENERATED_TOKENS`): the driver
        polls it for its progress line while a `generate` call is still running."""
        return GENERATED_TOKENS.total()

    def replayed_tokens(self) -> int:
        """Tokens of stored samples replayed in this actor so far (a sample bank: `REPLAYED_TOKENS`)."""
        return REPLAYED_TOKENS.total()

    def count_tokens(self, text: str) -> int:
        return self.backend.count_tokens(text)

    def close(self) -> None:
        self.backend.close()


class RemoteBackend(Backend):
    """Backend proxy: forwards generate()/count_tokens() to an `LLMEngine` Ray actor."""

    def __init__(self, engine):
        import ray

        self._ray = ray
        self.engine = engine
        self.info = info = ray.get(engine.info.remote())
        self.model_id, self.synthetic, self.context_length = info["model_id"], info["synthetic"], info["context_length"]

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        return self._ray.get(self.engine.generate.remote(list(requests)))

    def count_tokens(self, text: str) -> int:
        return self._ray.get(self.engine.count_tokens.remote(text))


# ---------------------------------------------------------------------------------------------------
# Pools


@dataclass
class RolloutReport:
    results: list[ChunkResult]
    worker_restarts: int = 0
    episodes_redone: int = 0
    wall_s: float = 0.0


class LocalPool:
    """`rollout.num_workers: 0`: one in-process worker, no Ray (tests, debugging)."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.worker = RolloutWorker(cfg, 0)
        self.synthetic = self.worker.backend.synthetic
        self.call_log: CallLogSpec | None = None  # set_call_log

    def set_call_log(self, spec: CallLogSpec | None) -> None:
        """Log (and replay) the model calls of the chunks the next collections run (train/call_log.py)."""
        self.call_log = spec

    def collect(self, weights: dict[str, torch.Tensor], chunks: list[ChunkSpec],
                on_chunk: Callable[[int, int], None] | None = None,
                on_result: Callable[[ChunkResult], None] | None = None) -> RolloutReport:
        """Run `chunks` in order; `on_result(chunk)` sees each chunk as it finishes (to keep it on disk)."""
        t0 = time.perf_counter()
        self.worker.set_weights(weights)
        results, done, total = [], 0, sum(len(c.env_seeds) for c in chunks)
        for c in chunks:
            results += self.worker.rollout(None, [c], calls=self.call_log)
            if on_result:
                on_result(results[-1])
            done += len(c.env_seeds)
            if on_chunk:
                on_chunk(done, total)
        return RolloutReport(results=results, wall_s=time.perf_counter() - t0)

    def generated_tokens(self) -> int:
        """Tokens generated in this process so far (the backend runs here), as they come back."""
        return GENERATED_TOKENS.total()

    def replayed_tokens(self) -> int:
        """Tokens of stored samples replayed in this process so far (a sample bank), as they are served."""
        return REPLAYED_TOKENS.total()

    def close(self) -> None:
        self.worker.close()


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join a cluster (`--ray-address`) or start a local Ray with the machine's CPUs."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=True,
                 configure_logging=True, logging_level="warning")


def engine_num_gpus(cfg: TrainConfig) -> float:
    """GPUs each LLM engine actor asks Ray for: `rollout.engine_num_gpus`, or by default the vLLM backend's
    tensor-parallel size (option `tensor_parallel_size`, default 1) and 0 for every other backend."""
    if cfg.rollout.engine_num_gpus is not None:
        return float(cfg.rollout.engine_num_gpus)
    if cfg.llm.backend_kind() == "vllm":
        return float(cfg.llm.backend_options().get("tensor_parallel_size", 1))
    return 0.0


class RayPool:
    """Rollout workers as Ray actors (each with its vector env) + `rollout.num_engines` LLM engine actors.

    Worker i sends its requests to engine i % num_engines; each engine asks Ray for `engine_num_gpus(cfg)` GPUs,
    so on a GPU cluster Ray places one engine per GPU (group).

    A worker that dies is killed for good and recreated; its chunks are redone with the same seeds (so the
    results are unchanged) and counted in `worker_restarts` / `episodes_redone`.
    """

    def __init__(self, cfg: TrainConfig, address: str | None = None):
        import ray

        init_ray(address)
        self.ray = ray
        self.cfg = cfg
        placement = cfg.llm.placement
        if placement == "auto":
            placement = "in_worker" if cfg.llm.synthetic else "engine"
        self.engines: list = []
        if placement == "engine":
            gpus = engine_num_gpus(cfg)
            # With GPUs, Ray places each engine on its own GPU (group) and sets its CUDA_VISIBLE_DEVICES.
            engine_cls = ray.remote(LLMEngine).options(
                num_cpus=cfg.rollout.engine_num_cpus, num_gpus=gpus,
                max_concurrency=max(2, 2 * math.ceil(cfg.rollout.num_workers / cfg.rollout.num_engines)))
            self.engines = [engine_cls.remote(cfg) for _ in range(cfg.rollout.num_engines)]
            infos = ray.get([e.info.remote() for e in self.engines])  # surfaces engine start-up errors here
            self.engine_info = infos
            self.synthetic = bool(infos[0]["synthetic"])
        else:
            self.synthetic = cfg.llm.synthetic
        self._worker_cls = ray.remote(RolloutWorker).options(num_cpus=cfg.rollout.worker_num_cpus, max_restarts=0)
        self.workers = [self._spawn(i) for i in range(cfg.rollout.num_workers)]
        ray.get([w.pid.remote() for w in self.workers])  # fail fast on construction errors
        self.total_restarts = 0
        self._engine_tokens = 0  # the engines' last answer to `generated_tokens`
        self._engine_replayed = 0  # and to `replayed_tokens`
        self._chunk_tokens = 0  # in-worker backends: completion tokens of the chunks returned so far
        self.call_log: CallLogSpec | None = None  # set_call_log

    def set_call_log(self, spec: CallLogSpec | None) -> None:
        """Log (and replay) the model calls of the chunks the next collections run (train/call_log.py); a worker
        on another host than the spec's logs nothing."""
        self.call_log = spec

    def generated_tokens(self) -> int:
        """Tokens generated so far: polled from the LLM engine actors, which count them as completions come back
        (their spare concurrency answers while a `generate` runs); with in-worker backends (no engine) the busy
        workers cannot be asked, so their tokens (replayed ones included) count when a chunk returns."""
        if not self.engines:
            return self._chunk_tokens
        from ray.exceptions import GetTimeoutError

        try:
            self._engine_tokens = sum(self.ray.get([e.generated_tokens.remote() for e in self.engines], timeout=5))
        except GetTimeoutError:
            pass  # an engine too busy to answer now: show the last count
        return self._engine_tokens

    def replayed_tokens(self) -> int:
        """Tokens of stored samples the LLM engine actors replayed so far (a sample bank), polled like
        `generated_tokens`; 0 with in-worker backends, whose replayed tokens `generated_tokens` counts with the rest
        when a chunk returns."""
        if not self.engines:
            return 0
        from ray.exceptions import GetTimeoutError

        try:
            self._engine_replayed = sum(self.ray.get([e.replayed_tokens.remote() for e in self.engines], timeout=5))
        except GetTimeoutError:
            pass
        return self._engine_replayed

    def _spawn(self, index: int):
        """Worker `index` talks to engine `index % num_engines` (no engine: it builds its own backend)."""
        engine = self.engines[index % len(self.engines)] if self.engines else None
        return self._worker_cls.remote(self.cfg, index, engine)

    def collect(self, weights: dict[str, torch.Tensor], chunks: list[ChunkSpec],
                on_chunk: Callable[[int, int], None] | None = None,
                on_result: Callable[[ChunkResult], None] | None = None) -> RolloutReport:
        """Chunks go round-robin to the workers, one call each, so a finished chunk is never redone,
        `on_result(chunk)` sees each chunk as it finishes (to keep it on disk) and
        `on_chunk(episodes_done, episodes_total)` reports progress inside a long real-model iteration."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        t0 = time.perf_counter()
        ref = self.ray.put(weights)  # broadcast once per iteration
        n = len(self.workers)
        generation = [0] * n  # bumped when worker i is recreated: its older calls fail but need one restart
        pending = {}
        for k, c in enumerate(chunks):
            pending[self.workers[k % n].rollout.remote(ref, [c], False, self.call_log)] = (
                k % n, generation[k % n], c)
        results: dict[int, ChunkResult] = {}
        restarts = redone = done = 0
        total = sum(len(c.env_seeds) for c in chunks)
        while pending:
            [fut], _ = self.ray.wait(list(pending), num_returns=1)
            i, gen, chunk = pending.pop(fut)
            try:
                [results[chunk.index]] = self.ray.get(fut)
            except (RayActorError, ActorDiedError, ActorUnavailableError) as err:
                if gen == generation[i]:
                    self.total_restarts += 1
                    restarts += 1
                    if self.total_restarts > self.cfg.rollout.max_worker_restarts * max(1, n):
                        raise RuntimeError(f"rollout worker {i} died too often ({self.total_restarts} restarts): "
                                           f"{err}") from err
                    print(f"[rollout] worker {i} died ({type(err).__name__}); restarting it and redoing its "
                          f"unfinished chunks", flush=True)
                    try:
                        self.ray.kill(self.workers[i], no_restart=True)
                    except Exception:
                        pass
                    self.workers[i] = self._spawn(i)
                    generation[i] += 1
                redone += len(chunk.env_seeds)  # same seeds on the new worker: the same episodes
                pending[self.workers[i].rollout.remote(ref, [chunk], False, self.call_log)] = (
                    i, generation[i], chunk)
                continue
            self._chunk_tokens += sum(e.completion_tokens for e in results[chunk.index].episodes)
            if on_result:
                on_result(results[chunk.index])
            done += len(chunk.env_seeds)
            if on_chunk:
                on_chunk(done, total)
        ordered = [results[c.index] for c in chunks]
        return RolloutReport(results=ordered, worker_restarts=restarts, episodes_redone=redone,
                             wall_s=time.perf_counter() - t0)

    def close(self) -> None:
        for w in self.workers:
            try:
                self.ray.kill(w)
            except Exception:
                pass
        for engine in self.engines:
            try:
                self.ray.get(engine.close.remote(), timeout=30)
            except Exception:
                pass
            self.ray.kill(engine)


def make_pool(cfg: TrainConfig, address: str | None = None):
    return LocalPool(cfg) if cfg.rollout.num_workers == 0 else RayPool(cfg, address)
