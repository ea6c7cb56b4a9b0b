"""The DEAR debate POMDP as a Gymnasium environment (docs/DESIGN.md §6): `dear/Debate-v0`.

One episode = one debate of `n_rounds` exchange rounds on a question drawn (seeded) from a task split.
`reset` runs round 0 (independent answers); each `step` runs ONE exchange round under the action.

Observation (Dict, float32, all entries in [0, 1]):
    "selection"   (V(2V+1),)  per agent [b_i, u_i, one_hot(i)]           (dear.policy.selection_observation);
                  with profile_feature then each agent's profile one-hot (V x P, `profile_vocabulary`),
                  with confidence_feature then each agent's confidence in its answer (V, exp of mean token logprob)
    "belief"      (V, V)      belief masses b_ij (b_ii = 0)
    "uncertainty" (V,)        u_i
    "state"       (state_dim,) centralised-critic state                    (dear.regulator.state_dim)
Action (Dict):
    "mask"        MultiBinary(V(V-1)) ordered pairs in dear.policy.pair_order: 1 = agent i reads agent j
    "behavior"    Box([-10, 10], (2V,)) raw pre-sigmoid (z_T, z_P) per agent, agent-major
                  [z_0T, z_0P, z_1T, ...]; mapped by dear.policy.to_sampling with temperature_range/top_p_range.
  with `actions="extended"` also (and "selection" gains 3 decision features, dear.regulator.decision_features):
    "kinds"       MultiDiscrete([3] * V): each agent's turn, 0 = revise (reads its masked peers), 1 = keep (no
                  call), 2 = fresh (an independent sample from the question alone)
    "stop"        Discrete(2): 1 ends the debate before this round (no call); the vote is taken at once, so an
                  episode has 1 .. n_rounds steps.
`start_width` < V starts round 0 from fewer samples (the rest wait, no call, until a fresh turn seats them) and
`turn_kinds` limits the kinds the world can play (a bank world replayed offline: keep and fresh).
Which turns are real: with a `bank` backend round 0 and fresh turns replay the model's stored samples (each turn's
`source` names its shelf and index, its T / top-p snapped to the bank's grid); other turns are live or simulated
as the backend says (`info["synthetic"]`).
`decision` picks the final vote's answers: the last round's (the paper's), every sample (all-answers), every
sample weighted by its agent's certainty 1 - u_i (belief-weighted, dear.regulator.CertaintyWeigher), or every sample
weighted by its own confidence (confidence-weighted: CISC's softmax of mean token log-probabilities at temperature
`vote_tau`; the calls then ask for log-probabilities).
Reward (envs/reward.py): 0 on intermediate steps (unless `shaping=True`); terminal
    score(plurality answer) - token_cost * (all prompt + completion tokens of the debate) / 1000,
where the score is 1 when the plurality answer is correct and 1/k for a k-way tie holding the correct answer
(the expected correctness of a tie-break, dear.vote's one tie rule),
with the parts in info["reward_correct"] and info["reward_tokens"].
Shaping (off by default): potential-based (Ng, Harada & Russell 1999), Φ(s_r) = the score of the vote the debate
would take after round r (1 when its answer is correct, 1/k for a k-way tie holding it: the final reward's own rule),
Φ = 0 at the terminal state; step r adds shaping_coef * (γ Φ(s_r) - Φ(s_{r-1}))
with γ = shaping_gamma (set it to the trainer's discount, happo.gamma = 1 by default). Its discounted sum over
an episode telescopes to -shaping_coef * Φ(s_0), fixed by round 0 before any action, so every policy's return
shifts by the same amount and the optimal policy is unchanged; the per-step terms still credit the rounds
that made agents correct.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dear import tasks
from dear.debate.engine import DECISIONS, Debate, DebateConfig, DebateEngine, RoundControl, sampling_range_errors
from dear.debate.profiles import AgentProfile, as_profiles, feature_vocabulary
from dear.debate.prompts import LAYOUTS
from dear.debate.trace import DebateTrace
from dear.evidence import Encoder, make_encoder
from dear.llm.base import Backend, serves
from dear.policy import (
    DEFAULT_TEMPERATURE_RANGE,
    DEFAULT_TOP_P_RANGE,
    KINDS,
    RAW_BOUND,
    n_pairs,
    pair_order,
    selection_obs_dim,
    to_sampling,
)
from dear.confidence import TOP_LOGPROBS
from dear.regulator import BeliefObservation, CertaintyWeigher, make_controls, observe, state_dim
from dear.tasks.types import Question
from envs.reward import potential, shaping_term, token_penalty


@dataclass
class DebateEnvConfig:
    """Everything that defines the environment besides the backend/encoder objects."""

    task: str = "synthetic"
    split: str | None = None
    n_questions: int | None = None  # first n of the (seeded) shuffled split; None = all
    n_agents: int = 3
    n_rounds: int = 2  # exchange rounds = episode length
    temperature0: float = 0.7  # round-0 sampling
    top_p0: float = 0.9
    temperature_range: tuple[float, float] = DEFAULT_TEMPERATURE_RANGE
    top_p_range: tuple[float, float] = DEFAULT_TOP_P_RANGE
    token_cost: float = 0.01  # λ_tok per 1000 tokens
    max_tokens: int = 512
    shaping: bool = False
    shaping_coef: float = 0.1
    shaping_gamma: float = 1.0  # γ of the shaping term F = γΦ(s') - Φ(s); the trainer's discount
    layout: str = DebateConfig.layout  # exchange-round prompt layout (dear/debate/prompts.py LAYOUTS)
    silent: bool = False  # an agent that reads nobody keeps its answer without a model call (DebateConfig.silent)
    answer_aware: float = 0.0  # weight of parsed-answer agreement in e_ij (regulator.observe); 0 = the paper's
    behavior_map: str = "sigmoid"  # raw behavior action -> (T, top-p) (dear.policy.to_sampling)
    # "paper": the action is pairs + (T, top-p); "extended" adds a turn kind per agent and a stop (module docstring)
    actions: str = "paper"
    decision: str = "last-round"  # the final vote's rule (dear.debate.engine.DECISIONS)
    vote_tau: float = DebateConfig.vote_tau  # the confidence-weighted vote's softmax temperature (CISC's tau)
    seed: int = 0  # seeds question loading and the engine's per-request seeds
    # Per-agent reply style and token limit (dear/debate/profiles.py), one per agent; None = the paper's agents.
    # Every agent runs on the env's one backend (`llm`), so a profile names no backend here.
    agent_profiles: tuple[AgentProfile, ...] | None = None
    # Seat the profiles in a random order per debate (drawn with the debate's question and seed), so a policy
    # meets every profile in every seat; False = agent i runs profile i.
    shuffle_profiles: bool = False
    # Observe each agent's profile (one-hot over `profile_vocabulary`) beside the paper's features
    # (dear.policy module docstring); False = the paper's observations.
    profile_feature: bool = False
    # The paper's actions also observe the decision features (dear.policy: round / R, the vote's margin); the
    # extended actions always do
    decision_features: bool = False
    # Round 0 answers with the first start_width agents (None = all); the others wait until a fresh turn seats them
    # (DebateConfig.start_width). An adaptive sampler decides after its first sample. Extended actions only.
    start_width: int | None = None
    # The extended actions' turn kinds this world can play (a subset of dear.policy.KINDS): a bank world replayed
    # offline has no model for revise turns, so it allows keep and fresh (the policy gives the others probability 0)
    turn_kinds: tuple[str, ...] = KINDS
    # Observe each agent's confidence in its answer (exp of its sample's mean token log-probability,
    # dear.regulator.confidence_features); every call then asks for log-probabilities
    confidence_feature: bool = False
    # At most this many independent samples a debate (DebateConfig.max_samples; None = no budget): a bank world's
    # samples per question, so a long horizon never asks for a sample the bank does not hold
    max_samples: int | None = None
    # At most this many new independent samples a round (DebateConfig.fresh_per_round; None = no limit): the first
    # agents in seat order that ask draw them, so with 1 the policy chooses who samples next, one at a time
    fresh_per_round: int | None = None

    @property
    def reads_confidence(self) -> bool:
        """Whether the world needs the samples' log-probabilities: the policy observes confidence or the vote
        weighs by it."""
        return bool(self.confidence_feature) or self.decision == "confidence-weighted"

    def __post_init__(self):
        if self.n_agents < 2:
            raise ValueError(f"n_agents must be >= 2, got {self.n_agents}")
        if self.n_rounds < 1:
            raise ValueError(
                f"n_rounds must be >= 1 (an episode needs one exchange round), got {self.n_rounds}"
            )
        for name, problem in sampling_range_errors(self.temperature_range, self.top_p_range):
            raise ValueError(f"{name} {problem}")
        self.temperature_range = tuple(float(x) for x in self.temperature_range)
        self.top_p_range = tuple(float(x) for x in self.top_p_range)
        if self.token_cost < 0:
            raise ValueError(f"token_cost must be >= 0, got {self.token_cost}")
        if not 0 < self.shaping_gamma <= 1:
            raise ValueError(f"shaping_gamma must be in (0, 1], got {self.shaping_gamma}")
        if self.behavior_map not in ("sigmoid", "clip"):
            raise ValueError(f"behavior_map must be sigmoid|clip, got {self.behavior_map!r}")
        if self.actions not in ("paper", "extended"):
            raise ValueError(f"actions must be paper|extended, got {self.actions!r}")
        if self.decision not in DECISIONS:
            raise ValueError(f"decision must be one of {list(DECISIONS)}, got {self.decision!r}")
        if isinstance(self.vote_tau, bool) or not isinstance(self.vote_tau, (int, float)) or not self.vote_tau > 0:
            raise ValueError(f"vote_tau must be a number > 0, got {self.vote_tau!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if isinstance(self.answer_aware, bool) or not 0.0 <= float(self.answer_aware) <= 1.0:
            raise ValueError(f"answer_aware must be a weight in [0, 1], got {self.answer_aware!r}")
        self.answer_aware = float(self.answer_aware)
        if self.agent_profiles is not None:
            self.agent_profiles = as_profiles(self.agent_profiles, "agent_profiles")
            if len(self.agent_profiles) != self.n_agents:
                raise ValueError(f"agent_profiles has {len(self.agent_profiles)} profiles for n_agents={self.n_agents}")
            named = [k for k, p in enumerate(self.agent_profiles) if p.backend is not None]
            if named:
                raise ValueError(f"agent_profiles[{named[0]}].backend: the env runs every agent on its one backend "
                                 f"(llm); leave the profile's backend unset")
        self.turn_kinds = tuple(str(k) for k in self.turn_kinds)
        if not self.turn_kinds or any(k not in KINDS for k in self.turn_kinds) \
                or len(set(self.turn_kinds)) != len(self.turn_kinds):
            raise ValueError(f"turn_kinds must be distinct kinds of {list(KINDS)}, got {list(self.turn_kinds)}")
        if (self.start_width is not None or self.turn_kinds != KINDS) and self.actions != "extended":
            raise ValueError("start_width and turn_kinds need actions='extended' (fresh turns, keeps and a stop)")
        if self.start_width is not None and not 1 <= self.start_width <= self.n_agents:
            raise ValueError(f"start_width must be in 1..n_agents={self.n_agents}, got {self.start_width}")
        if self.start_width is not None and self.start_width < self.n_agents and "fresh" not in self.turn_kinds:
            raise ValueError("start_width < n_agents needs the fresh turn kind (waiting agents join with fresh samples)")
        for name in ("shuffle_profiles", "profile_feature"):
            if getattr(self, name) and self.agent_profiles is None:
                raise ValueError(f"{name} needs agent_profiles (a pool whose agents differ)")

    @property
    def profile_vocabulary(self) -> tuple[str, ...] | None:
        """The profile feature's one-hot order: the pool's distinct profile names in pool order (None without it)."""
        if not self.profile_feature:
            return None
        return feature_vocabulary(self.agent_profiles)


    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any], env_name: str = "DebateEnvConfig") -> DebateEnvConfig:
        """The config from an env constructor's keyword arguments; TypeError naming any that is not a field."""
        unknown = sorted(set(keywords) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"{env_name}() got unexpected keyword arguments {unknown}; the env's settings are the "
                            f"fields of envs.debate_env.DebateEnvConfig")
        return cls(**keywords)


@dataclass(frozen=True)
class EpisodeSummary:
    """What a finished (or failed) debate reports in its terminal info["episode"]: per-round (rounds run x V)
    answers, correctness, masks and sampling, the outcome, and the full `DebateTrace`."""

    question_id: str
    final_answer: str | None
    final_correct: bool  # the vote's seeded pick is correct
    final_score: float  # the vote's expected correctness over tied leaders (dear.vote's tie rule)
    tie: bool
    failed: bool
    error: str | None  # why the debate failed (a backend request gave up), None when it finished
    tokens_total: int
    prompt_tokens: int
    completion_tokens: int
    answers_per_round: list[list[str | None]]  # (R+1, V) normalised answer keys
    correct_per_round: np.ndarray  # (R+1, V) bool
    masks_per_round: np.ndarray  # (R+1, V, V) bool: [r, i, j] = agent i read agent j in round r
    temperature_per_round: np.ndarray  # (R+1, V)
    top_p_per_round: np.ndarray  # (R+1, V)
    trace: DebateTrace
    planned_rounds: int = -1  # exchange rounds the debate was set up for (more than it ran if it stopped)

    @classmethod
    def of(cls, d: Debate) -> EpisodeSummary:
        tr = d.trace
        return cls(
            question_id=str(d.question.id), final_answer=tr.final_answer, final_correct=bool(tr.final_correct),
            final_score=tr.final_expected, tie=bool(tr.tie), failed=bool(d.failed), error=tr.error, tokens_total=int(tr.total_tokens),
            prompt_tokens=int(tr.prompt_tokens), completion_tokens=int(tr.completion_tokens),
            answers_per_round=tr.answer_keys(), correct_per_round=tr.correctness(), masks_per_round=tr.masks(),
            temperature_per_round=np.array([[t.temperature for t in ts] for ts in tr.rounds], dtype=np.float64),
            top_p_per_round=np.array([[t.top_p for t in ts] for ts in tr.rounds], dtype=np.float64),
            planned_rounds=int(d.n_rounds),
            trace=tr,
        )


@dataclass
class ParsedAction:
    """A validated action of one debate."""

    pairs: np.ndarray  # (V(V-1),) int8
    mask: np.ndarray  # (V, V) bool
    raw: np.ndarray  # (V, 2) float32
    temperature: np.ndarray  # (V,)
    top_p: np.ndarray  # (V,)
    kinds: tuple[str, ...] | None = None  # extended actions: each agent's turn kind (KINDS names)
    stop: bool = False  # extended actions: the debate ends before this round


class DebateCore:
    """Shared machinery of `DebateEnv` and `DebateVectorEnv`: backend, encoder, engine, questions, spaces,
    action validation, observations, rewards and infos for a batch of debates."""

    def __init__(
        self,
        config: DebateEnvConfig,
        llm: str | Backend = "sim",
        encoder: str | Encoder | None = None,
        questions: Sequence[Question] | None = None,
        llm_kwargs: Mapping[str, Any] | None = None,
    ):
        self.config = cfg = config
        if isinstance(llm, Backend):
            self.backend, self._owns_backend = llm, False
        elif isinstance(llm, str):
            from dear.llm.registry import make_backend

            self.backend, self._owns_backend = make_backend(llm, **dict(llm_kwargs or {})), True
        else:
            raise ValueError(f"llm must be a backend spec string or a Backend, got {type(llm).__name__}")
        self.synthetic = bool(getattr(self.backend, "synthetic", False))
        if encoder is None:
            encoder = "hashing" if self.synthetic else "minilm"
        self.encoder: Encoder = make_encoder(encoder) if isinstance(encoder, str) else encoder
        if questions is None:
            questions = tasks.load(cfg.task, split=cfg.split, n=cfg.n_questions, seed=cfg.seed)
        self.questions = [q for q in questions if serves(self.backend, q.task, q.id)]
        if not self.questions:
            raise ValueError(f"task {cfg.task!r} split {cfg.split!r} has no questions"
                             + (f" that {self.backend.model_id} serves" if questions else ""))
        self.engine = DebateEngine(
            self.backend,
            DebateConfig(
                n_agents=cfg.n_agents,
                n_rounds=cfg.n_rounds,
                temperature0=cfg.temperature0,
                top_p0=cfg.top_p0,
                max_tokens=cfg.max_tokens,
                seed=cfg.seed,
                layout=cfg.layout,
                silent=bool(cfg.silent),
                decision=cfg.decision,
                agent_profiles=cfg.agent_profiles,
                start_width=cfg.start_width,
                max_samples=cfg.max_samples,
                fresh_per_round=cfg.fresh_per_round,
                vote_tau=cfg.vote_tau,
                logprobs=TOP_LOGPROBS if cfg.reads_confidence else None,
            ),
            weigher=CertaintyWeigher(self.encoder, cfg.answer_aware),
        )
        v = cfg.n_agents
        self.pairs = pair_order(v)
        self.state_dim = state_dim(v)
        self.observation_space = spaces.Dict(
            {
                "selection": spaces.Box(0.0, 1.0, (selection_obs_dim(v, cfg.actions, len(cfg.profile_vocabulary or ()),
                                                                       cfg.decision_features,
                                                                       cfg.confidence_feature),), np.float32),
                "belief": spaces.Box(0.0, 1.0, (v, v), np.float32),
                "uncertainty": spaces.Box(0.0, 1.0, (v,), np.float32),
                "state": spaces.Box(0.0, 1.0, (self.state_dim,), np.float32),
            }
        )
        action_spaces = {
            "mask": spaces.MultiBinary(n_pairs(v)),
            "behavior": spaces.Box(-RAW_BOUND, RAW_BOUND, (2 * v,), np.float32),
        }
        if cfg.actions == "extended":
            action_spaces.update(kinds=spaces.MultiDiscrete([len(KINDS)] * v), stop=spaces.Discrete(2))
        self.action_space = spaces.Dict(action_spaces)
        self.action_keys = sorted(action_spaces)

    # ------------------------------------------------------------------ actions
    def parse_action(self, action: Any, where: str = "action") -> ParsedAction:
        """Validate one debate's action; ValueError naming the bad field otherwise."""
        v, k = self.config.n_agents, n_pairs(self.config.n_agents)
        if not isinstance(action, Mapping):
            raise ValueError(f"{where} must be a dict with keys {self.action_keys}, got {type(action).__name__}")
        keys = set(action)
        if keys != set(self.action_keys):
            raise ValueError(f"{where} must have exactly the keys {self.action_keys}, got {sorted(map(str, keys))}")
        try:
            pairs = np.asarray(action["mask"])
        except (TypeError, ValueError) as e:  # ragged lists etc.
            raise ValueError(f"{where}['mask'] is not an array: {e}") from None
        if pairs.shape != (k,):
            raise ValueError(
                f"{where}['mask'] must have shape ({k},) = V(V-1) ordered pairs "
                f"(i reads j, for i in range(V) for j != i), got shape {pairs.shape}"
            )
        if pairs.dtype.kind not in "biuf" or not np.isin(pairs, (0, 1)).all():
            raise ValueError(f"{where}['mask'] must hold only 0/1, got {pairs.tolist()}")
        try:
            raw = np.asarray(action["behavior"], dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}['behavior'] is not a float array: {e}") from None
        if raw.shape != (2 * v,):
            raise ValueError(
                f"{where}['behavior'] must have shape ({2 * v},) = 2V raw values "
                f"[z_0T, z_0P, z_1T, ...], got shape {raw.shape}"
            )
        if not np.isfinite(raw).all():
            raise ValueError(
                f"{where}['behavior'] contains NaN/inf at indices "
                f"{np.flatnonzero(~np.isfinite(raw)).tolist()}"
            )
        if (np.abs(raw) > RAW_BOUND).any():
            raise ValueError(
                f"{where}['behavior'] must lie in [-{RAW_BOUND}, {RAW_BOUND}] (raw pre-sigmoid), "
                f"got {raw.tolist()}"
            )
        pairs = pairs.astype(np.int8)
        mask = np.zeros((v, v), dtype=bool)
        for bit, (i, j) in zip(pairs, self.pairs):
            mask[i, j] = bool(bit)
        raw = raw.reshape(v, 2).astype(np.float32)
        s = to_sampling(raw, self.config.temperature_range, self.config.top_p_range, self.config.behavior_map)
        kinds, stop = self._parse_kinds_stop(action, where) if self.config.actions == "extended" else (None, False)
        return ParsedAction(pairs=pairs, mask=mask, raw=raw, temperature=s.temperature, top_p=s.top_p,
                            kinds=kinds, stop=stop)

    def _parse_kinds_stop(self, action: Mapping, where: str) -> tuple[tuple[str, ...], bool]:
        v = self.config.n_agents
        kinds = np.asarray(action["kinds"])
        if kinds.shape != (v,) or kinds.dtype.kind not in "iu" or not np.isin(kinds, range(len(KINDS))).all():
            raise ValueError(f"{where}['kinds'] must be {v} integers in 0..{len(KINDS) - 1} "
                             f"({', '.join(f'{i} = {k}' for i, k in enumerate(KINDS))}), got {kinds.tolist()}")
        stop = np.asarray(action["stop"])
        if stop.size != 1 or stop.dtype.kind not in "biu" or int(stop.reshape(-1)[0]) not in (0, 1):
            raise ValueError(f"{where}['stop'] must be 0 or 1, got {stop.tolist()}")
        names = tuple(KINDS[int(k)] for k in kinds)
        barred = sorted(set(names) - set(self.config.turn_kinds))
        if barred:
            raise ValueError(f"{where}['kinds']: {barred} not playable in this world (turn_kinds "
                             f"{list(self.config.turn_kinds)})")
        return names, bool(stop.reshape(-1)[0])

    def controls(self, parsed: Sequence[ParsedAction]) -> list[RoundControl]:
        extended = self.config.actions == "extended"
        return make_controls(
            np.stack([p.mask for p in parsed]),
            np.stack([p.temperature for p in parsed]),
            np.stack([p.top_p for p in parsed]),
            [p.kinds for p in parsed] if extended else None,
            np.array([p.stop for p in parsed]) if extended else None,
        )

    # ------------------------------------------------------------------ debates
    def start(
        self, rngs: Sequence[np.random.Generator], question_indices: Sequence[int | None]
    ) -> list[Debate]:
        """Draw a question, a debate seed and (shuffle_profiles) a seating per sub-debate and run round 0 (one
        engine.start call)."""
        chosen, seeds, orders = [], [], []
        for rng, idx in zip(rngs, question_indices):
            if idx is None:
                idx = int(rng.integers(len(self.questions)))
            elif not 0 <= int(idx) < len(self.questions):
                raise ValueError(f"options['question_index']={idx} outside [0, {len(self.questions)})")
            chosen.append(self.questions[int(idx)])
            seeds.append(int(rng.integers(2**31 - 1)))
            # drawn after the seed, so the questions and seeds of a run do not move when shuffling is switched on
            orders.append(tuple(int(k) for k in rng.permutation(self.config.n_agents))
                          if self.config.shuffle_profiles else None)
        return self.engine.start(chosen, debate_seeds=seeds, protocol="env", pool_orders=orders)

    def observe(self, debates: Sequence[Debate]) -> tuple[list[dict[str, np.ndarray]], BeliefObservation]:
        """Per-debate observation dicts (float32, clipped into the [0, 1] boxes against rounding)."""
        bo = observe(debates, self.encoder, self.config.answer_aware, self.config.profile_vocabulary,
                     self.config.confidence_feature)
        arrays = {
            "selection": bo.selection_input(self.config.actions, self.config.decision_features).numpy(),
            "belief": bo.b.numpy(),
            "uncertainty": bo.u.numpy(),
            "state": bo.state.numpy(),
        }
        arrays = {k: np.clip(a, 0.0, 1.0).astype(np.float32) for k, a in arrays.items()}
        return [{k: a[n] for k, a in arrays.items()} for n in range(len(debates))], bo

    # ------------------------------------------------------------------ rewards / infos
    def round_info(self, d: Debate) -> dict[str, Any]:
        turns = d.last_turns
        return {
            "round": int(d.round),
            "answers": [t.answer_key for t in turns],
            "correct": np.array([t.correct for t in turns], dtype=bool),
            "round_tokens": int(sum(t.prompt_tokens + t.completion_tokens for t in turns)),
            "tokens": int(d.trace.total_tokens),
            "temperature": np.array([t.temperature for t in turns], dtype=np.float64),
            "top_p": np.array([t.top_p for t in turns], dtype=np.float64),
            "peers": [list(t.peers) for t in turns],
            "question_id": d.question.id,
            "debate_id": d.debate_id,
            "synthetic": self.synthetic,
            "failed": bool(d.failed),
        }

    def reward(self, d: Debate, prev_correct_frac: float) -> tuple[float, dict[str, Any]]:
        """Reward of the step that just ran on `d` plus the reward parts for info."""
        cfg = self.config
        # Φ(terminal) = 0 makes the shaping sum policy-invariant (module docstring).
        phi = 0.0 if d.done else potential(d)
        shaping = shaping_term(cfg.shaping_coef, cfg.shaping_gamma, phi, prev_correct_frac) if cfg.shaping else 0.0
        parts: dict[str, Any] = {"reward_shaping": shaping}
        reward = shaping
        if d.done:
            correct = bool(d.trace.final_correct)
            r_correct = d.trace.final_expected  # ties as expected values (dear.vote), not the seeded pick
            r_tokens = -token_penalty(d.trace.total_tokens, cfg.token_cost)
            reward += r_correct + r_tokens
            trace = d.trace
            parts.update(
                reward_correct=r_correct,
                reward_tokens=r_tokens,
                final_correct=correct,
                final_answer=trace.final_answer,
                tie=bool(trace.tie),
                tokens_total=int(trace.total_tokens),
                prompt_tokens=int(trace.prompt_tokens),
                completion_tokens=int(trace.completion_tokens),
                # (R+1, V) per-round views for transitions / HCR / BCR
                answers_per_round=trace.answer_keys(),
                correct_per_round=trace.correctness(),
                masks_per_round=trace.masks(),
                episode=EpisodeSummary.of(d),
            )
        return reward, parts

    def close(self) -> None:
        if self._owns_backend:
            self.backend.close()


class DebateEnv(gym.Env):
    """Single-debate POMDP (see module docstring). Registered as ``dear/Debate-v0``.

    ``gymnasium.make("dear/Debate-v0", llm="sim", task="synthetic", n_agents=3, n_rounds=2)``.
    ``reset(options={"question_index": k})`` debates question k instead of a random one.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        llm: str | Backend = "sim",
        encoder: str | Encoder | None = None,
        questions: Sequence[Question] | None = None,
        llm_kwargs: Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        **knobs: Any,  # the DebateEnvConfig fields (task, n_agents, token_cost, ...), declared there only
    ):
        super().__init__()
        self.config = DebateEnvConfig.from_keywords(knobs, "DebateEnv")
        self.core = DebateCore(
            self.config, llm=llm, encoder=encoder, questions=questions, llm_kwargs=llm_kwargs
        )
        self.observation_space = self.core.observation_space
        self.action_space = self.core.action_space
        self.render_mode = render_mode
        self.debate: Debate | None = None
        self.last_belief: BeliefObservation | None = None  # torch view of the last observation (b, u, ...)
        self._prev_frac = 0.0
        self._return = 0.0
        self._episode_over = False

    @property
    def backend(self) -> Backend:
        return self.core.backend

    @property
    def engine(self) -> DebateEngine:
        return self.core.engine

    def _observe(self) -> dict[str, np.ndarray]:
        obs, self.last_belief = self.core.observe([self.debate])
        return obs[0]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"question_index"}
        if unknown:
            raise ValueError(f"reset options: unknown keys {sorted(unknown)}; known: ['question_index']")
        self.debate = self.core.start([self.np_random], [options.get("question_index")])[0]
        self._prev_frac = potential(self.debate)
        self._return = 0.0
        self._episode_over = False
        info = self.core.round_info(self.debate)
        return self._observe(), info

    def step(self, action):
        if self.debate is None:
            raise RuntimeError("DebateEnv.step called before reset()")
        if self._episode_over:
            raise RuntimeError("DebateEnv.step called on a finished debate; call reset()")
        # A debate whose round 0 failed (backend error) is already done: the engine skips it and this step
        # returns the terminal reward (a failed debate counts as wrong) with info["failed"] = True.
        parsed = self.core.parse_action(action)
        self.core.engine.step([self.debate], self.core.controls([parsed]))
        d = self.debate
        reward, parts = self.core.reward(d, self._prev_frac)
        self._prev_frac = potential(d)
        self._return += reward
        info = self.core.round_info(d)
        info.update(parts)
        info["mask"] = parsed.mask
        if d.done:
            self._episode_over = True
            info["episode_return"] = self._return
            info["episode_length"] = d.round
        return self._observe(), float(reward), bool(d.done), False, info

    def close(self):
        self.core.close()

