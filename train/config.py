"""Typed training configuration: YAML files in `configs/`, dotted CLI overrides, strict validation.

A YAML file may start with `extends: other.yaml` (relative to its own folder) and then override any
subset of keys. Unknown or mistyped keys raise `ConfigError` naming the dotted key and the file.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from dear.debate.engine import TURN_KINDS, DebateConfig, sampling_range_errors
from dear.debate.profiles import AgentProfile, as_profiles, feature_vocabulary
from dear.debate.prompts import LAYOUTS
from dear.llm.registry import KINDS, PRESETS, check_repeatable, is_synthetic, kind_of
from dear.policy import DEFAULT_TEMPERATURE_RANGE, DEFAULT_TOP_P_RANGE

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

# LLM presets -> backend spec for dear.llm.registry.make_backend (docs/DESIGN.md §7), and the backend kinds: both
# read from the registry's one table of kinds (dear.llm.registry.KINDS).
LLM_PRESETS: dict[str, str] = dict(PRESETS)
PRESET_NAMES = tuple(LLM_PRESETS)  # the values llm.preset takes (its Literal)
BACKEND_KINDS = tuple(KINDS)  # the first part of a backend spec; llm.options may be keyed by them


class ConfigError(ValueError):
    """A config file or override has an unknown key, a wrong type or a bad value."""


@dataclass
class RunConfig:
    name: str = "dear"  # run directory prefix: run.out_dir/NAME-<time>
    seed: int = 1  # seeds questions, sampling, policy init and minibatches
    out_dir: str = "runs"  # where run directories are made
    iterations: int = 200  # HAPPO iterations (rollout + update)
    checkpoint_every: int = 10  # iterations; a checkpoint is also written at the end and on SIGINT/SIGTERM
    device: str = "auto"  # learner device: auto = CUDA when present, else CPU; or cpu / cuda / cuda:N
    torch_threads: int = 1  # learner threads; 1 keeps the CPU free for the LLM engine


@dataclass
class LLMConfig:
    preset: Literal[PRESET_NAMES] = "local"  # see LLM_PRESETS
    spec: str | None = None  # explicit make_backend spec; overrides the preset
    url: str | None = None  # for preset "openai": http://host:port/v1[#model]
    max_tokens: int = 512  # completion tokens per agent turn
    cache: str | None = None  # path of a persistent response cache (SQLite), or None
    # Where the backend lives with Ray: "engine" = one shared Ray actor (the default for real models),
    # "in_worker" = each rollout worker builds its own (the default for the cheap stateless sim).
    placement: Literal["auto", "engine", "in_worker"] = "auto"
    # llama.cpp threads of a local or smoke backend; null = set at the run's start (DEAR_LLAMA_THREADS, else every
    # usable core) and written here into the run's config.yaml, so --resume decodes with the same count (a seed's
    # texts depend on it)
    threads: int | None = None
    # decode one request at a time without prompt-cache reuse (a local or smoke backend, whose n_parallel is then 1),
    # so that a seed gives the same texts whatever else is in flight; slower (bench/bench_repeatable.py)
    repeatable: bool = False
    # Extra keyword arguments for make_backend: flat ({n_parallel: 6}), or by backend kind ({local: {n_parallel: 6},
    # vllm: {tensor_parallel_size: 2}}) so that switching llm.preset never hands one backend another's options.
    options: dict[str, Any] = field(default_factory=dict)

    def backend_kind(self) -> str:
        """The backend kind of the spec (dear.llm.registry.KINDS: local, smoke, openai, vllm, sim, bank)."""
        try:
            return kind_of(self.backend_spec())
        except ValueError as e:
            raise ConfigError(f"llm.spec: {e}") from None

    def backend_options(self) -> dict[str, Any]:
        """The keyword arguments for this backend: `options` itself, or its entry for `backend_kind()`."""
        by_kind = [k for k in self.options if k in BACKEND_KINDS]
        if not by_kind:
            return dict(self.options)
        flat = sorted(set(self.options) - set(by_kind))
        if flat:
            raise ConfigError(f"llm.options mixes backend kinds {by_kind} with plain options {flat}; put each "
                              f"option under its backend kind (e.g. llm.options.local.n_parallel)")
        chosen = self.options.get(self.backend_kind()) or {}
        if not isinstance(chosen, dict):
            raise ConfigError(f"llm.options.{self.backend_kind()} must be a mapping of keyword arguments")
        return dict(chosen)

    def backend_spec(self) -> str:
        if self.spec:
            return self.spec
        if self.preset == "openai":
            if not self.url:
                raise ConfigError("llm.url is required when llm.preset is 'openai'")
            return LLM_PRESETS["openai"].format(url=self.url)
        return LLM_PRESETS[self.preset]

    @property
    def synthetic(self) -> bool:
        return is_synthetic(self.backend_spec())


@dataclass
class EnvSection:
    """The training environment (envs.DebateEnvConfig gets these under the same names)."""

    task: str = "gsm8k"  # training questions (see dear.tasks.task_names())
    split: str | None = "train"  # dataset split; None = the task's default
    n_questions: int | None = None  # seeded subset of the split; None = all
    n_agents: int = 3  # V, debating agents
    n_rounds: int = 2  # R exchange rounds after round 0 (= env steps per episode)
    temperature_range: tuple[float, float] = DEFAULT_TEMPERATURE_RANGE  # behavior policy: temperatures it can choose
    top_p_range: tuple[float, float] = DEFAULT_TOP_P_RANGE  # behavior policy: top-p values it can choose
    token_cost: float = 0.01  # lambda_tok: reward penalty per 1,000 tokens
    fusion: Literal["dst", "mean"] = "dst"  # peer-opinion fusion: Dempster-Shafer or the mean ablation
    encoder: str | None = None  # None = the env's default for the backend (minilm real, hashing sim)
    layout: str = DebateConfig.layout  # exchange-round prompt layout: multiturn (Du et al.) or single
    silent: bool = False  # option: an agent that reads nobody keeps its answer without a model call
    answer_aware: float = 0.0  # option: weight of parsed-answer agreement in e_ij; 0 = the paper's
    # The regulator's actions: "paper" (who reads whom + T/top-p) or "extended" (also per agent revise / keep /
    # fresh sample, and a stop after each round); envs/debate_env.py documents both.
    actions: Literal["paper", "extended"] = "paper"
    # the final vote: last round, every sample, every sample weighted by its agent's certainty 1 - u_i, or every
    # sample weighted by its own confidence (CISC's softmax of mean token log-probabilities at temperature vote_tau)
    decision: Literal["last-round", "all-answers", "belief-weighted", "confidence-weighted"] = "last-round"
    # the confidence-weighted vote's softmax temperature (the CISC tau fitted on GSM8K train questions,
    # configs/rule-params-gsm8k-train.json); read only by decision: confidence-weighted
    vote_tau: float = DebateConfig.vote_tau
    # Potential-based shaping with Φ = the round's plurality score (envs/debate_env.py): the optimum is unchanged,
    # and the return loses the variance round 0 fixed before any action (its std halves in the fitted world).
    shaping: bool = True
    shaping_coef: float = 1.0  # 1 = the return becomes final score − round-0 plurality score − token cost
    options: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments for the env
    # Agent profiles, one per agent: a mapping {style: cot|direct|pot, max_tokens: N, backend: spec}, each key
    # optional, or its compact form ("pot", "direct:64"; dear/debate/profiles.py); every agent runs on the llm
    # backend, so a backend may only repeat its spec.
    # None = the paper's agents.
    agent_profiles: list[dict[str, Any] | str] | None = None
    # Seat the profiles in a random order per debate (envs/debate_env.py), so the policy meets each in every seat
    shuffle_profiles: bool = False
    # Observe each agent's profile (one-hot, dear/policy.py); off = the paper's observations
    profile_feature: bool = False
    # The paper's actions also observe the decision features (round / R, the vote's margin; dear/policy.py)
    decision_features: bool = False
    # Extended actions: round 0 answers with the first start_width agents (null = all); the others wait until a
    # fresh turn seats them (envs/debate_env.py)
    start_width: int | None = None
    # Extended actions: the turn kinds the world can play (a bank world offline has no revise turns: [keep, fresh])
    turn_kinds: list[str] = field(default_factory=lambda: list(TURN_KINDS))
    # Observe each agent's confidence in its answer (exp of its sample's mean token log-probability)
    confidence_feature: bool = False
    # At most this many independent samples a debate (null = no budget); a fresh turn past it keeps its answer
    max_samples: int | None = None
    # At most this many new independent samples a round (null = no limit); of the agents that ask, the first in seat
    # order draw (envs/debate_env.py). 1: one sample at a time, and who asks chooses whose mode samples next
    fresh_per_round: int | None = None

    def profile_vocabulary(self) -> tuple[str, ...] | None:
        """The profile feature's one-hot order (the pool's distinct names, in pool order); None without it."""
        if not self.profile_feature or self.agent_profiles is None:
            return None
        return feature_vocabulary(as_profiles(self.agent_profiles, "env.agent_profiles"))

    def profiles(self, llm_spec: str) -> tuple[AgentProfile, ...] | None:
        """The validated `agent_profiles` for a run on backend `llm_spec` (their backends left unset: the env's own);
        ConfigError naming the key otherwise."""
        if self.agent_profiles is None:
            return None
        try:
            profiles = as_profiles(self.agent_profiles, "env.agent_profiles")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if len(profiles) != self.n_agents:
            raise ConfigError(f"env.agent_profiles: {len(profiles)} profiles for env.n_agents={self.n_agents} (one "
                              f"per agent)")
        for k, p in enumerate(profiles):
            if p.backend is not None and p.backend != llm_spec:
                raise ConfigError(f"env.agent_profiles[{k}].backend: {p.backend!r} is not the run's backend "
                                  f"{llm_spec!r}; training runs every agent on the llm backend (leave backend unset)")
        return tuple(replace(p, backend=None) for p in profiles)


@dataclass
class RolloutConfig:
    num_workers: int = 1  # Ray rollout actors; 0 = in-process rollouts without Ray
    envs_per_worker: int = 4  # sub-debates per vector env (batched into one backend call per round)
    episodes_per_iter: int = 16  # debates per HAPPO iteration (over all workers)
    worker_num_cpus: float = 0.5  # Ray scheduling share of a rollout actor
    engine_num_cpus: float = 0.5  # Ray scheduling share of each LLM engine actor
    num_engines: int = 1  # LLM engine actors (llm.placement engine); rollout worker i uses engine i % num_engines
    engine_num_gpus: float | None = None  # GPUs per engine actor; None = vLLM's tensor_parallel_size, else 0
    max_worker_restarts: int = 3  # per worker per run before giving up
    # Debates per question: a chunk's envs come in groups of this many that share the question and the debate
    # seed (so the same random draws), and each debate's advantage is measured against its group's others
    # (train/group_baseline.py). 1 = every debate its own question (the paper's).
    group_size: int = 1


@dataclass
class PolicySection:
    """Network sizes and the baseline slots of dear.policy.PolicyConfig (n_agents/ranges come from env)."""

    hidden: int = 64  # width of the selection and behavior networks
    critic_hidden: int = 128  # width of the centralised critic
    log_std_init: float = -0.5  # behavior Gaussian's initial log sigma
    selection_mode: Literal["learned", "full", "random"] = "learned"  # "full" = no-selection ablation
    behavior_mode: Literal["learned", "fixed"] = "learned"  # "fixed" = no-behavior ablation
    fixed_temperature: float = 0.7  # MAD's sampling; also the learned behavior mean's starting point
    fixed_top_p: float = 0.9  # MAD's top-p; also the learned behavior mean's starting point
    # Raw behavior -> (T, top-p): "sigmoid" (the paper's squashed Gaussian) or "clip" (affine, clipped at the
    # range ends, which the mean then reaches at a finite value with a usable gradient; dear.policy.to_sampling).
    behavior_map: Literal["sigmoid", "clip"] = "clip"
    selection_bias_init: float = 0.0  # initial logit of every pair: 0 = read with p 0.5, no prior on density
    # Extended actions (env.actions = extended): learned, or a fixed rule that makes the policy a baseline
    # (kinds_mode fresh + stop_mode never + env.decision all-answers = self-consistency; dear.policy.PolicyConfig)
    # every agent's turn kind; fresh-one: agent 0 draws a fresh sample, the others keep (adaptive SC with agree)
    kinds_mode: Literal["learned", "revise", "keep", "fresh", "fresh-one"] = "learned"
    stop_mode: Literal["learned", "never", "agree"] = "learned"  # agree: stop once the leader has stop_agree * V
    stop_agree: float = 1.0  # votes the leader needs for stop_mode=agree, as a fraction of V


@dataclass
class HAPPOConfig:
    gamma: float = 1.0  # episodes are short and the reward is terminal
    gae_lambda: float = 0.95  # GAE lambda
    clip_coef: float = 0.2  # PPO ratio clip epsilon
    clip_vloss: bool = False  # clip the value loss around the old values
    # Entropy bonus as in HARL (harl/configs/algos_cfgs/happo.yaml, algo.entropy_coef: 0.01, one value for
    # every actor); the entropy is of the agent's joint action (summed over pairs / over agents x 2 dims).
    ent_coef_selection: float = 0.01
    ent_coef_behavior: float = 0.01  # entropy bonus of the behavior policy (HARL: 0.01)
    vf_coef: float = 1.0  # value-loss weight
    max_grad_norm: float = 0.5  # gradient-norm clip per network
    lr_selection: float = 3e-4  # Adam learning rate of the selection policy
    lr_behavior: float = 3e-4  # Adam learning rate of the behavior policy
    lr_critic: float = 1e-3  # Adam learning rate of the critic
    # Linear decay of every learning rate to 0 over run.iterations (CleanRL's anneal_lr): late, noisy updates
    # move the policy less, so it settles where it is instead of random-walking around the optimum (the learning
    # suite: no world worse, docs/LEARNING_SUITE.md)
    anneal_lr: bool = True
    update_epochs: int = 5  # passes over each iteration's batch
    num_minibatches: int = 1  # minibatches per pass
    norm_adv: bool = True  # standardise advantages per minibatch
    value_norm: bool = True  # normalise value targets with running statistics (HARL ValueNorm)
    obs_norm: bool = False  # running per-feature standardisation of actor/critic inputs (dear.policy.RunningNorm)
    target_kl: float | None = None  # early stop of an agent's epochs when approx-KL exceeds it
    agent_order: Literal["fixed", "random"] = "fixed"  # fixed = selection then behavior (docs/DESIGN.md §6)
    # happo = sequential updates with the ratio factor (Kuba et al.); ablations: mappo (no factor), ppo (one
    # agent, the joint ratio of both actors)
    algorithm: Literal["happo", "mappo", "ppo"] = "happo"
    # joint = one ratio for the behavior's whole action (all agents x 2 dims, as HARL's product); per_dim = a
    # clipped ratio per agent and dimension, so one clip does not cap every dimension's step at once (temperature's
    # strong signal no longer stops top-p's weak one: the learning suite, docs/LEARNING_SUITE.md)
    behavior_ratio: Literal["joint", "per_dim"] = "per_dim"
    # Upper bound on the behavior Gaussian's log-std, kept by projection after every behavior step (None = no
    # bound). Without it the entropy bonus can widen a dimension with a weak signal until most samples sit at
    # the range ends, where the mean's gradient is lost (SAC bounds the log-std for the same reason).
    log_std_max: float | None = None


@dataclass
class LoggingConfig:
    wandb: bool = False  # used only when wandb is installed; WANDB_MODE=offline works with no network
    wandb_project: str = "dear"  # wandb project name
    progress: bool = True  # live progress: debates done, tokens, tokens/s, elapsed, ETA (dear/progress.py)


@dataclass
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    env: EnvSection = field(default_factory=EnvSection)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    policy: PolicySection = field(default_factory=PolicySection)
    happo: HAPPOConfig = field(default_factory=HAPPOConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    def validate(self) -> None:
        def need(cond: bool, key: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"{key}: {msg}")

        need(self.run.iterations >= 1, "run.iterations", "must be >= 1")
        if self.llm.preset != "openai" or self.llm.url or self.llm.spec:
            self.llm.backend_options()  # a mix of kind-keyed and plain options fails here, naming the keys
        need(self.run.checkpoint_every >= 1, "run.checkpoint_every", "must be >= 1")
        need(self.llm.threads is None or self.llm.threads >= 1, "llm.threads",
             "must be >= 1 (or null: chosen at start)")
        if self.llm.repeatable:
            try:
                check_repeatable([self.llm.backend_spec()], "llm.repeatable")
            except ValueError as e:
                raise ConfigError(str(e)) from None
        need(self.run.device == "auto" or _is_torch_device(self.run.device), "run.device",
             f"must be auto, cpu, cuda or cuda:N, got {self.run.device!r}")
        need(self.env.n_agents >= 2, "env.n_agents", "needs at least 2 agents")
        need(self.env.n_rounds >= 1, "env.n_rounds", "needs at least 1 exchange round")
        for field_name, problem in sampling_range_errors(self.env.temperature_range, self.env.top_p_range):
            need(False, f"env.{field_name}", problem)
        need(self.rollout.num_workers >= 0, "rollout.num_workers", "must be >= 0")
        need(self.rollout.envs_per_worker >= 1, "rollout.envs_per_worker", "must be >= 1")
        need(self.rollout.group_size >= 1 and self.rollout.envs_per_worker % self.rollout.group_size == 0,
             "rollout.group_size", f"must be >= 1 and divide rollout.envs_per_worker={self.rollout.envs_per_worker} "
             "(a group never spans two chunks)")
        need(self.env.layout in LAYOUTS, "env.layout", f"must be one of {list(LAYOUTS)}, got {self.env.layout!r}")
        need(isinstance(self.env.silent, bool), "env.silent", f"must be true or false, got {self.env.silent!r}")
        need(not isinstance(self.env.answer_aware, bool) and isinstance(self.env.answer_aware, (int, float))
             and 0.0 <= self.env.answer_aware <= 1.0, "env.answer_aware",
             f"must be a weight in [0, 1] (0 = the paper's evidence), got {self.env.answer_aware!r}")
        need(self.rollout.num_engines >= 1, "rollout.num_engines", "must be >= 1")
        need(self.rollout.engine_num_gpus is None or self.rollout.engine_num_gpus >= 0,
             "rollout.engine_num_gpus", "must be >= 0 (or null: vLLM's tensor_parallel_size, else 0)")
        need(self.rollout.episodes_per_iter >= 1, "rollout.episodes_per_iter", "must be >= 1")
        # An iteration runs whole vector-env batches (chunks) of envs_per_worker debates each.
        need(self.rollout.episodes_per_iter % self.rollout.envs_per_worker == 0, "rollout.episodes_per_iter",
             f"must be a multiple of rollout.envs_per_worker={self.rollout.envs_per_worker} (each chunk runs "
             f"that many debates), got {self.rollout.episodes_per_iter}")
        need(self.happo.update_epochs >= 1, "happo.update_epochs", "must be >= 1")
        need(self.happo.num_minibatches >= 1, "happo.num_minibatches", "must be >= 1")
        need(0 < self.happo.gamma <= 1, "happo.gamma", "must be in (0, 1]")
        need(0 <= self.happo.gae_lambda <= 1, "happo.gae_lambda", "must be in [0, 1]")
        need(self.happo.clip_coef > 0, "happo.clip_coef", "must be > 0")
        self.llm.backend_spec()  # openai without url
        self.env.profiles(self.llm.backend_spec())
        for key in ("shuffle_profiles", "profile_feature"):
            need(not getattr(self.env, key) or self.env.agent_profiles is not None, f"env.{key}",
                 "needs env.agent_profiles (a pool whose agents differ)")
        e = self.env
        need(all(k in TURN_KINDS for k in e.turn_kinds) and len(set(e.turn_kinds)) == len(e.turn_kinds) > 0,
             "env.turn_kinds", f"must be distinct kinds of {list(TURN_KINDS)}, got {e.turn_kinds!r}")
        need(e.start_width is None or 1 <= e.start_width <= e.n_agents, "env.start_width",
             f"must be in 1..env.n_agents={e.n_agents} (or null: all), got {e.start_width!r}")
        need(e.fresh_per_round is None or e.fresh_per_round >= 1, "env.fresh_per_round",
             f"must be >= 1 (or null: no limit), got {e.fresh_per_round!r}")
        for key, default in (("start_width", None), ("turn_kinds", list(TURN_KINDS)), ("fresh_per_round", None)):
            need(getattr(e, key) == default or e.actions == "extended", f"env.{key}", "needs env.actions=extended")


def _is_torch_device(name: str) -> bool:
    import torch

    try:
        torch.device(name)
    except RuntimeError:
        return False
    return True


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


# ---------------------------------------------------------------------------------------------------
# Strict conversion of plain YAML data into the dataclasses


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{where}key '{key}': expected {expected}, got {type(value).__name__} {value!r}")

    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, where)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1:  # one type besides None: its own error names the element that is wrong
            raise errors[0]
        raise bad(" or ".join(_type_name(a) for a in args))
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}key '{key}': must be one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad("a mapping")
        return _build(tp, value, key, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad("bool")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("int")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("float")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad("str")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise bad(f"a list of {len(args)} values")
        return tuple(_coerce(v, a, f"{key}[{i}]", where) for i, (v, a) in enumerate(zip(value, args)))
    if origin is list:
        (arg,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise bad("a list")
        return [_coerce(v, arg, f"{key}[{i}]", where) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad("a mapping")
        return dict(value)
    raise ConfigError(f"{where}key '{key}': unsupported field type {tp}")


def _build(cls: type, data: dict[str, Any], prefix: str, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            raise ConfigError(f"{where}unknown key '{key}' (known: {', '.join(sorted(names))})")
        kwargs[k] = _coerce(v, hints[k], key, where)
    return cls(**kwargs)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("options",):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def resolve_config_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise ConfigError(f"config file not found: {p}")
        return p
    p = CONFIG_DIR / f"{name_or_path}.yaml"
    if not p.exists():
        raise ConfigError(f"unknown config '{name_or_path}' (known in {CONFIG_DIR}: {', '.join(config_names())})")
    return p


def config_names() -> list[str]:
    """The named configs of configs/ (`--config NAME`), sorted."""
    return sorted(x.stem for x in CONFIG_DIR.glob("*.yaml"))


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: circular 'extends'")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    parent = data.pop("extends", None)
    # Validate each file on its own so an error names the file that holds the bad key.
    _build(TrainConfig, data, "", f"{path}: ")
    if parent:
        base = _read_yaml((path.parent / parent), seen + (path,))
        data = _deep_merge(base, data)
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key.sub=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    return key.split("."), yaml.safe_load(raw) if raw.strip() else None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    data = _deep_merge({}, data)
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{text}': '{part}' is not a section")
        node[path[-1]] = value
    return data


def load_config(name_or_path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Defaults <- YAML file (with its `extends` chain) <- dotted CLI overrides; then validated."""
    data: dict[str, Any] = {}
    where = ""
    if name_or_path:
        path = resolve_config_path(name_or_path)
        data = _read_yaml(path)
        where = f"{path}: "
    if overrides:
        _build(TrainConfig, apply_overrides({}, overrides), "", "command line: ")
        data = apply_overrides(data, overrides)
    cfg = _build(TrainConfig, data, "", where)
    cfg.validate()
    return cfg


# Keys whose default changed: a saved run config without them ran with these values, so a resumed run keeps them.
SETTINGS_BEFORE_THE_KEY: dict[str, Any] = {
    "policy.behavior_map": "sigmoid", "env.shaping": False,
    # the extended action set came later; every run before it played the paper's actions and vote
    "env.actions": "paper", "env.decision": "last-round", "policy.kinds_mode": "learned",
    "policy.stop_mode": "learned", "policy.stop_agree": 1.0,
    "rollout.group_size": 1,
    "env.agent_profiles": None,  # every run before agent profiles had the paper's agents
    "env.shuffle_profiles": False, "env.profile_feature": False, "env.decision_features": False,
    "happo.anneal_lr": False,
    "happo.log_std_max": None,
    "happo.behavior_ratio": "joint",
    "llm.threads": None,  # runs before it chose llama.cpp's threads at start and did not record them
    # every run before them started from V samples, could play every turn kind and did not observe confidence
    "env.start_width": None, "env.turn_kinds": list(TURN_KINDS), "env.confidence_feature": False,
    "env.max_samples": None,  # runs before it had no sample budget
    "env.fresh_per_round": None,  # nor a budget a round
    "llm.repeatable": False,  # runs before it decoded in llama.cpp slots (not repeatable)
    "env.vote_tau": DebateConfig.vote_tau,  # runs before it voted by no confidence (the value is never read)
}


def with_settings_before_the_key(data: dict[str, Any]) -> dict[str, Any]:
    """Plain config data (a run's config.yaml, a check's resolved config) with every key it was saved without
    set to the value runs had before the key existed (`SETTINGS_BEFORE_THE_KEY`)."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for dotted, value in SETTINGS_BEFORE_THE_KEY.items():
        section, key = dotted.split(".")
        if isinstance(data.get(section), dict):
            data[section].setdefault(key, value)
    return data


def config_from_dict(data: dict[str, Any], where: str = "") -> TrainConfig:
    """A validated config from plain data (e.g. a run's saved config.yaml; keys a run saved before they existed take
    the values that run used, `SETTINGS_BEFORE_THE_KEY`)."""
    data = with_settings_before_the_key(data)
    cfg = _build(TrainConfig, data, "", where)
    cfg.validate()
    return cfg


# ---------------------------------------------------------------- help text for the CLI
def field_help(cls: type = TrainConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, help) of every config field, the help being the field's trailing `# comment`
    in this file (one place for both the code and `python -m train.happo --help`)."""
    comments = _trailing_comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(f.default_factory if f.default is dataclasses.MISSING else f.default):
            out += field_help(f.default_factory, f"{key}.")
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        out.append((key, repr(_plain(default)), comments.get(f.name, "")))
    return out


def _trailing_comments(cls: type) -> dict[str, str]:
    import inspect
    import io
    import tokenize

    comments: dict[str, str] = {}
    above: list[str] = []  # comment lines right above a field, used when it has no trailing comment
    name = None
    for tok in tokenize.generate_tokens(io.StringIO(inspect.getsource(cls)).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 4 and name is None:
            name = tok.string  # a field line starts with its name at class-body indentation
            if above:
                comments[name] = " ".join(above)
        elif tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("# ").strip()
            if name is not None:
                comments[name] = text
            elif tok.start[1] == 4:
                above.append(text)
                continue
        if tok.type == tokenize.NEWLINE:
            name, above = None, []
        elif tok.type == tokenize.NL and name is not None:
            name = None
    return comments


def help_epilog() -> str:
    """All config keys with defaults and help, grouped by section, for argparse's epilog."""
    lines = ["config keys (override any of them as KEY=VALUE, e.g. rollout.episodes_per_iter=8):"]
    section = None
    for key, default, text in field_help():
        head = key.split(".")[0]
        if head != section:
            section = head
            lines.append(f"  {section}:")
        lines.append(f"    {key} = {default}" + (f"  -- {text}" if text else ""))
    return "\n".join(lines)
