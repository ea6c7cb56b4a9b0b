"""Building the parts of a training run from its config: the joint policy, the LLM backend and the vector env.

The one place where `TrainConfig` is turned into objects, under the same names (`n_agents`, `n_rounds`,
`temperature_range`, ...) the policy and the env use. Rollout collection (`train.workers`) only calls these.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from gymnasium.vector import AutoresetMode

from dear.llm.base import Backend, ChatRequest, Completion
from dear.llm.wrapper import BackendWrapper
from dear.llm.registry import uses_llama_cpp
from dear.policy import JointPolicy, PolicyConfig
from train.config import TrainConfig


def policy_config(cfg: TrainConfig) -> PolicyConfig:
    """The policy's config: network sizes from `policy`, V and the action ranges from `env`."""
    p = cfg.policy
    return PolicyConfig(
        n_agents=cfg.env.n_agents, selection_mode=p.selection_mode, behavior_mode=p.behavior_mode,
        fusion=cfg.env.fusion, selection_hidden=p.hidden, behavior_hidden=p.hidden, log_std_init=p.log_std_init,
        temperature_range=cfg.env.temperature_range, top_p_range=cfg.env.top_p_range,
        fixed_temperature=p.fixed_temperature, fixed_top_p=p.fixed_top_p, seed=cfg.run.seed,
        behavior_map=p.behavior_map, selection_bias_init=p.selection_bias_init, actions=cfg.env.actions,
        kinds_mode=p.kinds_mode, stop_mode=p.stop_mode, stop_agree=p.stop_agree,
        profiles=cfg.env.profile_vocabulary(), decision_features=cfg.env.decision_features,
        turn_kinds=tuple(cfg.env.turn_kinds), confidence_feature=cfg.env.confidence_feature,
    )


def make_policy(cfg: TrainConfig) -> JointPolicy:
    """A freshly initialised joint policy (seeded by `run.seed`)."""
    torch.manual_seed(cfg.run.seed)  # network initialisation
    return JointPolicy(policy_config(cfg))


def backend_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """Keyword arguments for `make_backend`: `llm.options`, or its entry for the chosen backend kind."""
    return cfg.llm.backend_options()


def settle_threads(cfg: TrainConfig, resumed: bool = False) -> str | None:
    """Fix the llama.cpp thread count of a local/smoke run in `cfg.llm.threads` (the run's config.yaml records it and
    `--resume` reuses it): `n_threads` of llm.options, else DEAR_LLAMA_THREADS, else every usable core
    (`dear.llm.local.choose_threads`, which never follows the machine's load). Returns the line the run prints about
    it; None for other backends."""
    if not uses_llama_cpp(cfg.llm.backend_spec()):
        return None
    from dear.llm.local import choose_threads

    env = os.environ.get("DEAR_LLAMA_THREADS")
    if cfg.llm.threads is not None:
        note = (f"llama.cpp threads: {cfg.llm.threads} (llm.threads in the run's config.yaml; the texts of a seed "
                f"depend on it)")
        if resumed and env and env.strip() != str(cfg.llm.threads):
            note += (f"; DEAR_LLAMA_THREADS={env} is not used: this run decodes with the count it started with "
                     f"(llm.threads=N changes it)")
        return note
    choice = choose_threads(cfg.llm.backend_options().get("n_threads"))
    cfg.llm.threads = choice.threads
    return (f"llama.cpp threads: {choice.threads} ({choice.override or 'every usable core'}; recorded as "
            f"llm.threads in the run's config.yaml, so --resume decodes with the same count)")


def make_local_backend(cfg: TrainConfig) -> Backend:
    """The backend `llm` names, in this process (wrapped in the response cache when `llm.cache` is set); a llama.cpp
    backend decodes with `llm.threads` threads when the config fixed them (`settle_threads`), and one request at a
    time with `llm.repeatable`; a bank world serves the env's task and split, from each agent profile's style's
    shelves, and with a fixed behavior (`policy.behavior_mode: fixed`) only those at its temperature."""
    from dear.llm.registry import make_backend

    options = backend_kwargs(cfg)
    if cfg.llm.threads is not None and uses_llama_cpp(cfg.llm.backend_spec()):
        options["n_threads"] = cfg.llm.threads
    if cfg.llm.repeatable and uses_llama_cpp(cfg.llm.backend_spec()):
        options.update(n_parallel=1, repeatable=True)  # one request at a time, whatever llm.options asks
    if cfg.llm.backend_kind() == "bank":  # the bank world serves the env's questions: its task, split and styles
        options.setdefault("benchmark", cfg.env.task)
        options.setdefault("split", (cfg.env.split or "train").partition("/")[0])
        profiles = cfg.env.profiles(cfg.llm.backend_spec())
        if profiles is not None:  # a pool that mixes modes replays each agent's style from its own shelves
            options.setdefault("profile", tuple(dict.fromkeys(p.style for p in profiles)))
        if cfg.policy.behavior_mode == "fixed":  # one sampling temperature: the other temperatures' shelves unread
            options.setdefault("temperature", cfg.policy.fixed_temperature)
    backend = make_backend(cfg.llm.backend_spec(), **options)
    if cfg.llm.cache:
        from dear.llm.cache import CachedBackend

        backend = CachedBackend(backend, cfg.llm.cache)
    return backend


class TimedBackend(BackendWrapper):
    """Measures time spent inside generate() (the "LLM share" of an iteration); the rest is the wrapped backend's."""

    def __init__(self, inner: Backend):
        super().__init__(inner)
        self.seconds = 0.0

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        t0 = time.perf_counter()
        try:
            return self.inner.generate(requests)
        finally:
            self.seconds += time.perf_counter() - t0


def env_knobs(cfg: TrainConfig) -> dict[str, Any]:
    """The env's settings (envs.debate_env.DebateEnvConfig): every `env` key the config shares by name, plus what other
    sections decide (the token limit, the seed, the discount the shaping uses, the behavior map, the profiles),
    then `env.options`."""
    from dataclasses import fields

    from envs.debate_env import DebateEnvConfig

    e = cfg.env
    names = {f.name for f in fields(DebateEnvConfig)}
    knobs = {f.name: getattr(e, f.name) for f in fields(e) if f.name in names}
    knobs.update(max_tokens=cfg.llm.max_tokens, seed=cfg.run.seed, shaping_gamma=cfg.happo.gamma,
                 behavior_map=cfg.policy.behavior_map, agent_profiles=e.profiles(cfg.llm.backend_spec()))
    knobs.update(e.options)
    return knobs


def make_vector_env(cfg: TrainConfig, backend: Backend):
    """The vector env of one rollout worker: `rollout.envs_per_worker` debates on `backend`."""
    from envs.vector_env import DebateVectorEnv

    # No autoreset: every chunk starts with a seeded reset and all debates end at the same step, so
    # autoreset would only generate round 0 of debates that are never stepped (a third of all LLM calls
    # at R = 2). Terminal infos then arrive in the last step's `infos` directly.
    return DebateVectorEnv(num_envs=cfg.rollout.envs_per_worker, llm=backend, encoder=cfg.env.encoder,
                           autoreset_mode=AutoresetMode.DISABLED, **env_knobs(cfg))
