"""The batched debate engine: V agents, round 0 independent, exchange rounds steered by a RoundControl.

One round of all active debates is one `Backend.generate` call per distinct backend, so llama.cpp slots,
vLLM continuous batching or concurrent HTTP requests decode everything together. Round r >= 1 is driven
from outside (`step(debates, controls)`), which is what protocols, the regulator and the RL environment need.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from dear import tasks
from dear.confidence import confidence_dict
from dear.debate import pot, prompts
from dear.debate.profiles import AgentProfile, as_profiles, profile_at
from dear.debate.sampling_rules import DEFAULT_PARAMS, cisc_weights, turn_confidence
from dear.debate.trace import WAITING, AgentTurn, DebateTrace, voting_turns
from dear.llm.base import Backend, BackendError, ChatMessage, ChatRequest, Completion
from dear.sandbox import DEFAULT_LIMITS, SandboxLimits
from dear.seeds import derive_seed  # noqa: F401  (re-exported: engine.derive_seed)
from dear.tasks.equivalence import AnswerClasses
from dear.tasks.types import Question
from dear.vote import VoteResult, vote

log = logging.getLogger(__name__)

T_MAX = 2.0  # the widest temperature range any backend we support accepts (OpenAI caps at 2)
# What an agent does in an exchange round (RoundControl.kinds): revise reading the selected peers (the paper's
# turn), keep its answer without a call, or draw a fresh independent sample from the question alone.
TURN_KINDS = ("revise", "keep", "fresh")
# How the final answer is decided (DebateConfig.decision): the paper's plurality over the last round, or the
# plurality over every distinct sample the debate produced (round 0, fresh samples and revisions; a kept answer
# is not a new sample, so it does not vote twice), or the same samples each weighted by its agent's certainty
# 1 - u_i in the round it answered (belief-weighted: the subjective-logic quantity the regulator observes;
# the engine gets the weights from a `Weigher`, dear.regulator.CertaintyWeigher), or the same samples each weighted
# by the model's own confidence in it (confidence-weighted: CISC's softmax of each sample's `RULE_SUMMARY` over
# `DebateConfig.vote_tau`, dear.debate.sampling_rules.cisc_weights; the debate must ask for log-probabilities).
DECISIONS = ("last-round", "all-answers", "belief-weighted", "confidence-weighted")
MSG_OVERHEAD_TOKENS = 8  # chat-template tokens per message (role markers), a conservative estimate (also the server's check)
MIN_MAX_TOKENS = 16
PROGRAM_WORKERS = 4  # programs of one round's `pot` turns run at most this many at a time (each in its own sandbox)


@dataclass(frozen=True)
class DebateConfig:
    n_agents: int = 3
    n_rounds: int = 2  # exchange rounds after round 0
    temperature0: float = 0.7  # round-0 sampling (independent answers)
    top_p0: float = 0.9
    max_tokens: int = 512
    seed: int = 0
    # Optional backend key per agent (heterogeneous mixes); keys index the engine's backend mapping.
    agent_backends: tuple[str, ...] | None = None
    # Optional agent profiles (dear/debate/profiles.py): agent i's backend key, reply style and token limit, the pool
    # continued cyclically when n_agents exceeds it. None = the paper's agents (byte-identical prompts and traces).
    agent_profiles: tuple[AgentProfile, ...] | None = None
    system_prompt: str = prompts.SYSTEM_PROMPT
    # Exchange-round prompt layout (dear/debate/prompts.py): "multiturn" (Du et al.'s growing conversation,
    # whose prefix a KV-cache slot reuses) or "single" (one fresh message per round). The default is the layout
    # that results/layout-gsm8k/summary.md (`python -m eval.layouts`) found not worse in accuracy and faster.
    layout: str = "multiturn"
    # "Silent" agents (an option, off by default): an agent whose mask reads nobody keeps its previous answer
    # without a model call; its turn copies the previous one with 0 tokens and `silent=True`. The paper
    # regenerates alone (pruning then saves only prompt tokens); with silent, the mask also controls completions.
    silent: bool = False
    decision: str = "last-round"  # DECISIONS
    # confidence-weighted votes only: the softmax temperature of the sample weights (fitted on training questions,
    # dear.debate.replay_orders.fit_tau), in the confidence's units
    vote_tau: float = DEFAULT_PARAMS.tau
    # The model's own confidence (dear/confidence.py): None = not asked; k >= 0 = every call asks for its tokens'
    # log-probabilities with k alternatives, and each turn records its confidence (or that the backend sent none).
    # A `pot` turn's answer is what its program printed, which is not in the completion text: its record has no
    # answer span (`answer_mean` None); the whole-completion summaries are there as for any turn.
    logprobs: int | None = None
    # How many agents answer in round 0 (1 .. n_agents; None = all): agents start_width.. wait (no call, no answer:
    # a turn with finish reason "waiting") until the controls give them a fresh sample. An adaptive sampler starts
    # from one sample and decides after it; a waiting agent asked to revise joins with a fresh sample instead (it
    # has no answer to revise), and nobody reads a waiting agent.
    start_width: int | None = None
    # A budget of independent samples (None = none): a fresh turn asked for once the debate holds this many keeps its
    # answer instead (a waiting agent keeps waiting). A world replayed from a bank of N samples a question sets N,
    # so a long horizon of one-at-a-time draws never asks for a sample the bank does not hold.
    max_samples: int | None = None
    # At most this many new independent samples a round (None = no limit): of the agents asking for one (a fresh
    # turn, or a waiting agent joining), the first in a seat order that rotates each round draw (`_drawing`: agents
    # that always ask take turns) and the others keep their answers (a waiting agent keeps waiting). With 1 a round
    # draws one sample, so in a pool of modes who asks chooses which mode samples next.
    fresh_per_round: int | None = None
    # Program-of-thought agents (reply style `pot`, dear/debate/pot.py): the limits every program runs under in the
    # sandbox (dear/sandbox.py; a server's are its start-up configuration's, no request changes them), and whether
    # peers are shown a `pot` turn's program (False: only what it printed; its author always sees its own).
    sandbox_limits: SandboxLimits = DEFAULT_LIMITS
    show_programs: bool = True
    # Independent samples numbered from one seed (False: each its own derived seed): sample n of a debate (round-0
    # agent n, or the n-th fresh sample) takes sample 0's seed + n, so round 0's requests differ only in seeds
    # counting up by one and llama.cpp samples them from one request that reads the prompt once (`n_cmpl`,
    # dear/llm/local.py). Another numbering than the default's: a run with it sends other requests than one without
    # (a response cache or a bank shelf built the other way does not serve it).
    shared_prompt: bool = False

    def __post_init__(self):
        if isinstance(self.sandbox_limits, Mapping):  # `dataclasses.asdict` of a config writes a mapping
            try:
                object.__setattr__(self, "sandbox_limits", SandboxLimits(**self.sandbox_limits))
            except TypeError as e:
                raise ValueError(f"DebateConfig.sandbox_limits: {e}") from None
        if not isinstance(self.sandbox_limits, SandboxLimits):
            raise ValueError(f"DebateConfig.sandbox_limits must be a dear.sandbox.SandboxLimits, got "
                             f"{type(self.sandbox_limits).__name__}")
        if not isinstance(self.show_programs, bool):
            raise ValueError(f"DebateConfig.show_programs must be True or False, got {self.show_programs!r}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"DebateConfig.logprobs must be None or >= 0, got {self.logprobs}")
        if self.decision not in DECISIONS:
            raise ValueError(f"DebateConfig.decision must be one of {DECISIONS}, got {self.decision!r}")
        if not self.vote_tau > 0:
            raise ValueError(f"DebateConfig.vote_tau must be > 0, got {self.vote_tau}")
        if self.n_agents < 1:
            raise ValueError(f"DebateConfig.n_agents must be >= 1, got {self.n_agents}")
        if self.n_rounds < 0:
            raise ValueError(f"DebateConfig.n_rounds must be >= 0, got {self.n_rounds}")
        if self.start_width is not None and not 1 <= self.start_width <= self.n_agents:
            raise ValueError(f"DebateConfig.start_width must be in 1..n_agents={self.n_agents} (or None), "
                             f"got {self.start_width}")
        if self.max_samples is not None and self.max_samples < self.round0_width:
            raise ValueError(f"DebateConfig.max_samples must be >= round 0's {self.round0_width} answers (or None), "
                             f"got {self.max_samples}")
        if self.fresh_per_round is not None and self.fresh_per_round < 1:
            raise ValueError(f"DebateConfig.fresh_per_round must be >= 1 (or None), got {self.fresh_per_round}")
        if self.max_tokens < 1:
            raise ValueError(f"DebateConfig.max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature0 <= T_MAX:
            raise ValueError(f"DebateConfig.temperature0 must be in [0, {T_MAX}], got {self.temperature0}")
        if not 0.0 < self.top_p0 <= 1.0:
            raise ValueError(f"DebateConfig.top_p0 must be in (0, 1], got {self.top_p0}")
        if self.layout not in prompts.LAYOUTS:
            raise ValueError(f"DebateConfig.layout must be one of {prompts.LAYOUTS}, got {self.layout!r}")
        if self.agent_backends is not None:
            object.__setattr__(self, "agent_backends", tuple(self.agent_backends))
            if len(self.agent_backends) != self.n_agents:
                raise ValueError(
                    f"DebateConfig.agent_backends has {len(self.agent_backends)} entries, n_agents={self.n_agents}"
                )
        if self.agent_profiles is not None:  # mappings too: `dataclasses.asdict` of a config writes them
            object.__setattr__(self, "agent_profiles", as_profiles(self.agent_profiles, "DebateConfig.agent_profiles"))
            if self.agent_backends is not None and any(p.backend for p in self.agent_profiles):
                raise ValueError("DebateConfig: agent_backends and agent_profiles both name backends; give them in "
                                 "agent_profiles only")

    def profile(self, agent: int) -> AgentProfile:
        """Agent `agent`'s profile (`profiles.profile_at`: the default one when there are no profiles)."""
        return profile_at(self.agent_profiles, agent)

    @property
    def round0_width(self) -> int:
        """Agents that answer in round 0 (`start_width`, all by default)."""
        return self.n_agents if self.start_width is None else self.start_width

    def agent_max_tokens(self, agent: int) -> int:
        """Agent `agent`'s completion limit: its profile's, else the debate's."""
        return self.profile(agent).max_tokens or self.max_tokens


def sampling_range_errors(temperature_range, top_p_range) -> list[tuple[str, str]]:
    """The one check of the ranges a behavior policy samples from, against the bounds every request must meet
    (RoundControl below): temperature in [0, T_MAX], top-p in (0, 1]. Returns (field, problem) pairs; the config
    and the env both raise from it, naming their own key."""
    errors = []
    t_lo, t_hi = (float(x) for x in temperature_range)
    if not 0 <= t_lo < t_hi <= T_MAX:
        errors.append(("temperature_range", f"needs 0 <= low < high <= {T_MAX} (the widest range every backend "
                                            f"accepts), got ({t_lo:g}, {t_hi:g})"))
    p_lo, p_hi = (float(x) for x in top_p_range)
    if not 0 < p_lo < p_hi <= 1.0:
        errors.append(("top_p_range", f"needs 0 < low < high <= 1, got ({p_lo:g}, {p_hi:g})"))
    return errors


@dataclass
class RoundControl:
    """What the next exchange round does: mask[i, j] = True -> agent i reads agent j's previous answer;
    guidance[i] (optional) is an extra instruction added to agent i's prompt (see prompts.py).

    `kinds[i]` (optional, TURN_KINDS) is agent i's turn: "revise" (reads its masked peers), "keep" (no call) or
    "fresh" (an independent sample from the question alone; its mask row is ignored). None = every agent revises.
    With DebateConfig.silent a revising agent that reads nobody keeps its answer instead. `stop` ends the debate before this round:
    nothing is generated and the final vote is taken over what the debate has."""

    mask: np.ndarray  # (V, V) bool, diagonal False
    temperature: np.ndarray  # (V,)
    top_p: np.ndarray  # (V,)
    guidance: tuple[str | None, ...] | None = None  # (V,) or None
    kinds: tuple[str, ...] | None = None  # (V,) of TURN_KINDS, or None
    stop: bool = False

    def __post_init__(self):
        mask = np.asarray(self.mask)
        if mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
            raise ValueError(f"RoundControl.mask must be a square (V, V) array, got shape {mask.shape}")
        if mask.dtype != bool:
            if not np.isin(mask, (0, 1)).all():
                raise ValueError("RoundControl.mask must be boolean or 0/1")
            mask = mask.astype(bool)
        if np.diag(mask).any():
            raise ValueError("RoundControl.mask has self-loops: the diagonal must be False (agents see their own answer anyway)")
        v = mask.shape[0]
        self.mask = mask
        for name, lo, hi, lo_open in (("temperature", 0.0, T_MAX, False), ("top_p", 0.0, 1.0, True)):
            arr = np.asarray(getattr(self, name), dtype=np.float64)
            if arr.ndim == 0:
                arr = np.full(v, float(arr))
            if arr.shape != (v,):
                raise ValueError(f"RoundControl.{name} must have shape ({v},), got {arr.shape}")
            if not np.isfinite(arr).all():
                raise ValueError(f"RoundControl.{name} contains NaN/inf: {arr.tolist()}")
            if (arr > hi).any() or (arr <= lo if lo_open else arr < lo).any():
                raise ValueError(f"RoundControl.{name} out of range {'(' if lo_open else '['}{lo}, {hi}]: {arr.tolist()}")
            setattr(self, name, arr)
        if self.kinds is not None:
            self.kinds = tuple(str(k) for k in self.kinds)
            if len(self.kinds) != v or any(k not in TURN_KINDS for k in self.kinds):
                raise ValueError(f"RoundControl.kinds must be {v} of {TURN_KINDS}, got {self.kinds!r}")
        self.stop = bool(self.stop)
        if self.guidance is not None:
            self.guidance = tuple(self.guidance)
            if len(self.guidance) != v or any(g is not None and not isinstance(g, str) for g in self.guidance):
                raise ValueError(f"RoundControl.guidance must be {v} strings or None, got {self.guidance!r}")

    @property
    def n_agents(self) -> int:
        return self.mask.shape[0]

    @classmethod
    def full(cls, n_agents: int, temperature: float = 0.7, top_p: float = 0.9) -> RoundControl:
        """Every agent reads every peer (classic MAD)."""
        return cls(~np.eye(n_agents, dtype=bool), np.full(n_agents, temperature), np.full(n_agents, top_p))


@dataclass
class Debate:
    """State of one debate; `trace` holds everything that happened."""

    question: Question
    debate_id: str
    seed: int
    n_rounds: int  # planned exchange rounds
    trace: DebateTrace
    vote_seed: int
    round: int = -1  # last completed round (-1 before round 0)
    failed: bool = False
    error: str | None = None
    finished: bool = False
    decision: str = "last-round"  # how the final answer is decided (DECISIONS)
    vote_tau: float = DEFAULT_PARAMS.tau  # a confidence-weighted vote's softmax temperature (DebateConfig.vote_tau)
    # Each agent's certainty 1 - u_i per completed round (round -> V values), filled by whoever computes beliefs
    # (the regulator's observation, a Weigher); the belief-weighted vote reads it.
    certainty: dict[int, list[float]] = field(default_factory=dict)
    # Agent i runs the pool's profile pool_order[i] (DebateConfig.agent_profiles, its backend and token limit);
    # None = profile i. A shuffled order per debate lets a policy meet every profile in every seat.
    pool_order: tuple[int, ...] | None = None
    # Groups the debate's answer keys by the grader's equivalence: every recorded key is its class's
    # representative, so `5/4` and `1.25` vote together everywhere downstream.
    classes: AnswerClasses = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.classes = AnswerClasses(self.question.kind)

    def pool_index(self, agent: int) -> int:
        """The pool position whose profile agent `agent` runs (`pool_order`; the agent itself without one)."""
        return self.pool_order[agent] if self.pool_order is not None and agent < len(self.pool_order) else agent

    @property
    def n_samples(self) -> int:
        """Independent samples drawn so far: round 0's answers (not its waiting seats) and every fresh turn (the next
        fresh sample's index)."""
        rounds = self.trace.rounds
        return (sum(not t.waiting for t in rounds[0]) if rounds else 0) + sum(t.fresh for turns in rounds[1:] for t in turns)

    @property
    def done(self) -> bool:
        return self.failed or self.finished

    @property
    def n_agents(self) -> int:
        return self.trace.n_agents

    @property
    def last_turns(self) -> list[AgentTurn]:
        return self.trace.rounds[-1] if self.trace.rounds else []

    @property
    def answers(self) -> list[str | None]:
        """Raw extracted answers of the last completed round, per agent."""
        return [t.answer for t in self.last_turns]

    @property
    def answer_keys(self) -> list[str | None]:
        return [t.answer_key for t in self.last_turns]

    def voters(self, decision: str = "last-round") -> list[AgentTurn]:
        """The turns whose answers vote: the last round's, or (all-answers) every turn that drew a new sample —
        all of round 0, and each later turn that was sent (a kept answer is not a new sample)."""
        if decision == "last-round" or not self.trace.rounds:
            return self.last_turns
        return voting_turns(self.trace.rounds, decision)

    def vote_weights(self, decision: str) -> list[float] | None:
        """The voters' weights: None (one vote each), under belief-weighted each voter's certainty in its round,
        under confidence-weighted the CISC weights of the voters' own confidences."""
        if decision == "confidence-weighted":
            return confidence_weights(self.voters(decision), self.vote_tau, self.debate_id)
        if decision != "belief-weighted":
            return None
        turns = self.voters(decision)
        missing = sorted({t.round for t in turns} - set(self.certainty))
        if missing:
            raise ValueError(f"debate {self.debate_id}: the belief-weighted vote needs certainties of rounds {missing}")
        return [self.certainty[t.round][t.agent] for t in turns]

    def vote(self, decision: str = "last-round") -> VoteResult:
        """The vote over the voting turns' answer keys (`voters`, weighted by `vote_weights`): its score over tied
        leaders, and a pick among them by an RNG seeded per debate+round."""
        turns = self.voters(decision)
        rng = np.random.default_rng([self.vote_seed, max(self.round, 0)])
        return vote([t.answer_key for t in turns], [t.correct for t in turns], rng, self.vote_weights(decision))


def confidence_weights(turns: Sequence[AgentTurn], tau: float, debate_id: str) -> list[float]:
    """The confidence-weighted vote's weights: `cisc_weights` of each turn's confidence (a turn without one weighs
    as the least confident voter; none with one: equal weights, and each turn's record says why it has none). A
    ValueError when no voter asked for log-probabilities (a trace that cannot have been voted so)."""
    if turns and all(t.confidence is None for t in turns):
        raise ValueError(f"debate {debate_id}: a confidence-weighted vote over samples that never asked for "
                         "log-probabilities (DebateConfig.logprobs unset)")
    return cisc_weights([turn_confidence(t) for t in turns], tau)


@dataclass
class EngineStats:
    """Where the engine's wall time went (for the overhead benchmark) and how many calls it made."""

    generate_calls: int = 0
    requests: int = 0
    backend_s: float = 0.0  # wall time inside Backend.generate
    total_s: float = 0.0  # wall time inside start()/step()
    completion_tokens: int = 0
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # prompt tokens the server took from its KV cache instead of reading them
    cached: int = 0
    fresh_completion_tokens: int = 0  # completion tokens actually decoded (not served from a cache)
    truncations: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: float) -> None:
        """Add to counters; debates running concurrently (`run_concurrent`) share one EngineStats."""
        with self._lock:
            for name, value in deltas.items():
                setattr(self, name, getattr(self, name) + value)


@dataclass
class _Pending:
    debate: Debate
    agent: int
    request: ChatRequest
    peers: list[int]
    truncated_peers: int
    guidance: str | None = None
    silent: bool = False  # no model call: the turn repeats the previous one (DebateConfig.silent)
    fresh: bool = False  # an independent sample from the question alone (RoundControl.kinds)
    waiting: bool = False  # no model call: the agent has not answered yet (DebateConfig.start_width)


@dataclass(frozen=True)
class _PromptBuilder:
    """Builds one exchange prompt with `n_cut` peer blocks and optionally the own answers cut to fit."""

    build: Callable[[int, bool], list[ChatMessage]]
    n_peer_blocks: int


def _shown(turn: AgentTurn, to_peer: bool = True, show_programs: bool = True) -> prompts.ShownAnswer:
    """A turn as a later prompt shows it: to peers a demoted turn is only its summary; to its author never. A `pot`
    turn's reasoning is its program, which peers see only with `show_programs` (its author always does)."""
    reasoning = turn.reasoning
    if to_peer and not show_programs and turn.program is not None:
        reasoning = pot.NOT_SHOWN
    return prompts.ShownAnswer(turn.agent, reasoning, turn.conclusion, turn.answer,
                               turn.peer_summary if to_peer else None)


def debate_id_of(question: Question, seed: int) -> str:
    """The id of the debate of `question` with debate seed `seed` (traces, corpora and done lists use it)."""
    return f"{question.task}/{question.id}/s{seed}"


@dataclass(frozen=True)
class GradedTurn:
    """A completion's answer, its normalised key, correctness and grader, and for a `pot` turn its program's run."""

    answer: str | None
    key: str | None
    correct: bool
    grader: str
    program: dict | None = None  # pot.PotRun.to_dict() of a `pot` turn; None for the other styles and a failed call

    def astuple(self) -> tuple[str | None, str | None, bool, str]:
        """(answer, key, correct, grader): what `graded_answer` returns."""
        return self.answer, self.key, self.correct, self.grader


def grade_turn(text: str, finish_reason: str, error: str | None, q: Question, style: str, *,
               limits: SandboxLimits = DEFAULT_LIMITS, program: dict | None = None,
               run_programs: bool = True) -> GradedTurn:
    """A completion's answer, graded. A completion cut at the token limit answers only where it marked an answer
    (prompts.extract); a failed call answers nothing; gold "" (inference) grades nothing.

    A `pot` completion (`style` "pot") is a program: its answer is the task extractor's reading of the last line
    the program printed in the sandbox under `limits` (pot.pot_answer; a refused, failed or silent program is no
    answer, never an exception). `program` (a stored run, `AgentTurn.program`) is read instead of running the
    program again, and with `run_programs=False` (re-grading a stored trace) nothing is ever run: a `pot` turn
    without a stored run answers nothing."""
    if style == pot.STYLE:
        answer = None
        if error is None and program is not None:
            answer = pot.answer_from_run(pot.PotRun.from_dict(program), q)
        elif error is None and run_programs:
            answer, run = pot.pot_answer(text, q, limits)
            program = run.to_dict()
        else:
            program = None
    else:
        answer = prompts.extract(text, q, truncated=finish_reason == "length", style=style) if error is None else None
        program = None
    key = tasks.normalize_answer(answer, q.kind) if answer is not None else None
    if answer is None or not q.gold:
        return GradedTurn(answer, key, False, "none", program)
    g = tasks.grade(answer, q)
    return GradedTurn(answer, key, bool(g.correct), g.grader, program)


def graded_answer(text: str, finish_reason: str, error: str | None, q: Question, style: str, *,
                  limits: SandboxLimits = DEFAULT_LIMITS, program: dict | None = None,
                  run_programs: bool = True) -> tuple[str | None, str | None, bool, str]:
    """(answer, normalised key, correctness, grader) of a completion: `grade_turn` without the program's run."""
    return grade_turn(text, finish_reason, error, q, style, limits=limits, program=program,
                      run_programs=run_programs).astuple()


def pot_on_synthetic_error(agent: int, profile: str, backend: str) -> str:
    """Why agent `agent` (profile `profile`) cannot be a `pot` agent on the synthetic backend `backend`."""
    others = ", ".join(s for s in prompts.STYLES if s != pot.STYLE)
    return (f"agent {agent}'s profile {profile!r} is a program-of-thought agent (style {pot.STYLE!r}) on the "
            f"synthetic backend {backend!r}, whose simulated debaters write no programs (they simulate the {others} "
            f"styles only), so it would never answer; run pot agents on a real model (--llm local, smoke, "
            f"openai:URL#MODEL, ...)")


def vote_seed_of(engine_seed: int, debate_seed: int) -> int:
    """The seed of a debate's tie-break RNG (its round index is mixed in at each vote)."""
    return derive_seed(engine_seed, int(debate_seed), 0x5EED)


def default_debate_seed(question: Question) -> int:
    """Stable per question id, so results do not depend on the position in a batch (and caches hit)."""
    return zlib.crc32(f"{question.task}/{question.id}".encode())


class Weigher(Protocol):
    """Fills `Debate.certainty` for every completed round of the given debates (the belief-weighted vote's weights)."""

    def __call__(self, debates: Sequence[Debate]) -> None: ...


class DebateEngine:
    def __init__(self, backends: Backend | Mapping[str, Backend], config: DebateConfig = DebateConfig(),
                 weigher: Weigher | None = None):
        """`weigher` is needed only by debates whose decision is belief-weighted (it computes their weights)."""
        self.config = config
        self.weigher = weigher
        single = isinstance(backends, Backend)
        self.backends: dict[str, Backend] = {"default": backends} if single else dict(backends)
        if not self.backends:
            raise ValueError("DebateEngine: empty backend mapping")
        self.agent_keys = self._agent_keys(single)
        self._check_pot_backends()
        self.stats = EngineStats()

    def _check_pot_backends(self) -> None:
        """A `pot` agent needs a model that writes programs: the synthetic debaters (`sim`) simulate `cot` and
        `direct` agents only, so a `pot` agent on them would never answer; refuse that pool up front."""
        for i in range(self.config.n_agents):
            backend = self.backends[self.agent_keys[i]]
            profile = self.config.profile(i)
            if profile.style == pot.STYLE and getattr(backend, "synthetic", False):
                raise ValueError(pot_on_synthetic_error(i, profile.name, backend.model_id))

    def _agent_keys(self, single: bool) -> list[str]:
        """Each agent's key into `self.backends`: DebateConfig.agent_backends, else its profile's backend, else the
        only backend. One Backend object serves every agent whatever they call it, as long as it is one name."""
        cfg = self.config
        source = "agent_backends" if cfg.agent_backends is not None else "agent_profiles"
        named = list(cfg.agent_backends) if cfg.agent_backends is not None else \
            [cfg.profile(i).backend for i in range(cfg.n_agents)]
        given = list(dict.fromkeys(k for k in named if k is not None))
        if single:
            if len(given) > 1:
                raise ValueError(f"DebateConfig.{source} names several backends but one Backend was given")
            return ["default"] * cfg.n_agents
        if None in named and len(self.backends) != 1:
            raise ValueError("DebateEngine: several backends given; set DebateConfig.agent_backends (or each agent "
                             "profile's backend) to map agents to them")
        missing = [k for k in given if k not in self.backends]
        if missing:
            raise ValueError(f"DebateConfig.{source}: unknown backend keys {missing}; known {sorted(self.backends)}")
        only = next(iter(self.backends))
        return [only if k is None else k for k in named]

    @property
    def model_ids(self) -> list[str]:
        return [self.backends[k].model_id for k in self.agent_keys]

    def _profile(self, d: Debate, agent: int) -> AgentProfile:
        """Agent `agent`'s profile in debate `d` (its pool position's)."""
        return self.config.profile(d.pool_index(agent))

    def _backend_key(self, d: Debate, agent: int) -> str:
        return self.agent_keys[d.pool_index(agent)]

    def _max_tokens(self, d: Debate, agent: int) -> int:
        return self.config.agent_max_tokens(d.pool_index(agent))

    # ------------------------------------------------------------ public API
    def create(
        self,
        questions: Sequence[Question],
        debate_seeds: Sequence[int] | None = None,
        n_rounds: int | None = None,
        protocol: str = "",
        decision: str | None = None,
        pool_orders: Sequence[Sequence[int] | None] | None = None,
    ) -> list[Debate]:
        """The debates `start` would run, before round 0 (for `advance`, which batches them with others).
        `decision` (DECISIONS) overrides the config's for these debates (a protocol's own rule). `pool_orders`
        (one per question, each a permutation of the agents or None) seats the profiles in another order."""
        cfg = self.config
        decision = cfg.decision if decision is None else decision
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {DECISIONS}, got {decision!r}")
        if decision == "confidence-weighted" and cfg.logprobs is None:
            raise ValueError("decision 'confidence-weighted' needs the samples' log-probabilities: set "
                             "DebateConfig.logprobs (e.g. dear.confidence.TOP_LOGPROBS)")
        if decision == "belief-weighted" and self.weigher is None:
            raise ValueError("decision 'belief-weighted' needs an engine with a weigher "
                             "(DebateEngine(..., weigher=dear.regulator.CertaintyWeigher(encoder)))")
        if debate_seeds is None:
            debate_seeds = [default_debate_seed(q) for q in questions]
        if len(debate_seeds) != len(questions):
            raise ValueError(f"debate_seeds has {len(debate_seeds)} entries for {len(questions)} questions")
        n_rounds = cfg.n_rounds if n_rounds is None else n_rounds
        orders = [self._pool_order(o) for o in pool_orders] if pool_orders is not None else [None] * len(questions)
        if len(orders) != len(questions):
            raise ValueError(f"pool_orders has {len(orders)} entries for {len(questions)} questions")
        debates = []
        for q, s, order in zip(questions, debate_seeds, orders):
            debate_id = debate_id_of(q, s)
            model_ids = self.model_ids if order is None else [self.model_ids[k] for k in order]
            trace = DebateTrace(
                debate_id=debate_id, question_id=q.id, task=q.task, question=q.question, gold=q.gold,
                kind=q.kind, model_ids=model_ids, seed=int(s), protocol=protocol,
                pool_order=None if order is None else list(order),
            )
            debates.append(
                Debate(question=q, debate_id=debate_id, seed=int(s), n_rounds=n_rounds, trace=trace, decision=decision,
                       vote_tau=cfg.vote_tau, vote_seed=vote_seed_of(cfg.seed, s), pool_order=order)
            )
        return debates

    def _pool_order(self, order: Sequence[int] | None) -> tuple[int, ...] | None:
        """A debate's seating: None, or a permutation of range(n_agents) (ValueError otherwise)."""
        if order is None:
            return None
        order = tuple(int(k) for k in order)
        if sorted(order) != list(range(self.config.n_agents)):
            raise ValueError(f"pool order {list(order)} is not a permutation of the {self.config.n_agents} agents")
        return order

    def start(
        self,
        questions: Sequence[Question],
        debate_seeds: Sequence[int] | None = None,
        n_rounds: int | None = None,
        protocol: str = "",
        decision: str | None = None,
        pool_orders: Sequence[Sequence[int] | None] | None = None,
    ) -> list[Debate]:
        """Create the debates and run round 0 for all of them (one generate call per backend); `create` says what
        `decision` and `pool_orders` do."""
        debates = self.create(questions, debate_seeds, n_rounds, protocol, decision, pool_orders)
        self.advance(debates, [], [])
        return debates

    def start_from_round0(
        self,
        questions: Sequence[Question],
        round0_turns: Sequence[Sequence[AgentTurn]],
        debate_seeds: Sequence[int] | None = None,
        n_rounds: int | None = None,
        protocol: str = "",
    ) -> list[Debate]:
        """Create the debates with a stored round 0 (one list of n_agents turns per question, agent order)
        instead of generating it, so several methods continue the very same round 0 (no backend call)."""
        if len(round0_turns) != len(questions):
            raise ValueError(f"round0_turns has {len(round0_turns)} entries for {len(questions)} questions")
        debates = self.create(questions, debate_seeds, n_rounds, protocol)
        for d, turns in zip(debates, round0_turns):
            if [t.agent for t in turns] != list(range(self.config.n_agents)) or any(t.round != 0 for t in turns):
                raise ValueError(f"round0_turns of {d.debate_id}: need round-0 turns of agents "
                                 f"0..{self.config.n_agents - 1} in order, got agents {[t.agent for t in turns]}")
            self._record_round(d, [replace(t) for t in turns])
        return debates

    def widen_round0(
        self,
        questions: Sequence[Question],
        stored_turns: Sequence[Sequence[AgentTurn]],
        protocol: str = "",
    ) -> list[Debate]:
        """Round-0-only debates of `n_agents` agents that keep each question's stored turns (agents 0..k-1,
        k < n_agents) and generate only agents k..n_agents-1 (one generate call per backend). Each new request is
        the one a full round 0 would send (its seed depends on debate and agent alone), so a widened row equals
        a row generated wide, without paying again for the stored answers."""
        if len(stored_turns) != len(questions):
            raise ValueError(f"stored_turns has {len(stored_turns)} entries for {len(questions)} questions")
        cfg = self.config
        debates = self.create(questions, None, 0, protocol)
        pending = []
        for d, turns in zip(debates, stored_turns):
            if [t.agent for t in turns] != list(range(len(turns))) or len(turns) >= cfg.n_agents \
                    or any(t.round != 0 for t in turns):
                raise ValueError(f"stored_turns of {d.debate_id}: need round-0 turns of agents 0..k-1 in order "
                                 f"with k < {cfg.n_agents}, got agents {[t.agent for t in turns]}")
            pending += self._round0_requests(d, range(len(turns), cfg.n_agents))
        new: dict[int, list[AgentTurn]] = {}
        for p, c in zip(pending, self._generate_all(pending) if pending else []):
            new.setdefault(id(p.debate), []).append(self._make_turn(p, c))
        for d, turns in zip(debates, stored_turns):
            added = sorted(new.get(id(d), []), key=lambda t: t.agent)
            self._record_round(d, [replace(t) for t in turns] + added)
        return debates

    def step(self, debates: Sequence[Debate], controls: Sequence[RoundControl], attempt: int = 0) -> None:
        """Run the next exchange round for every unfinished debate (one generate call per backend).
        `attempt` > 0 marks a redone round (see `redo_last_round`)."""
        self.advance([], debates, controls, attempt)

    def advance(self, new: Sequence[Debate], active: Sequence[Debate], controls: Sequence[RoundControl],
                attempt: int = 0) -> None:
        """Round 0 of `new` debates (from `create`) and the next exchange round of `active` ones, all in one
        generate call per backend: a server admits requests between rounds and they share the batch."""
        t0 = time.perf_counter()
        cfg = self.config
        if len(controls) != len(active):
            raise ValueError(f"step: {len(controls)} controls for {len(active)} debates")
        pending = []
        for d in new:
            if d.round >= 0:
                raise ValueError(f"advance: debate {d.debate_id} has already run round 0")
            pending += self._round0_requests(d, range(cfg.round0_width))
            pending += [self._waiting(d, i, 0) for i in range(cfg.round0_width, cfg.n_agents)]
        for d, ctl in zip(active, controls):
            if d.done:
                continue
            if d.round < 0:
                raise ValueError(f"step: debate {d.debate_id} has not run round 0; call start() first")
            if ctl.n_agents != cfg.n_agents:
                raise ValueError(f"RoundControl.mask is {ctl.mask.shape}, engine has n_agents={cfg.n_agents}")
            if ctl.stop:  # the debate ends here: no call, the vote is over what it has
                d.finished = True
                self._finalize(d)
                continue
            pending.extend(self._exchange_requests(d, ctl, attempt))
        if pending:
            self._execute(pending)
        self.stats.add(total_s=time.perf_counter() - t0)

    def run(
        self,
        questions: Sequence[Question],
        protocol,
        debate_seeds: Sequence[int] | None = None,
        on_round: Callable[[int, list[Debate]], None] | None = None,
    ) -> list[Debate]:
        """Run whole debates under a protocol (anything with `n_rounds` and `controls(debates)`)."""
        debates = self.start(questions, debate_seeds, n_rounds=protocol.n_rounds,
                             decision=getattr(protocol, "decision", None),
                             protocol=getattr(protocol, "name", type(protocol).__name__))
        if on_round:
            on_round(0, debates)
        r = 0
        while active := [d for d in debates if not d.done]:
            r += 1
            self.step(active, protocol.controls(active))
            if on_round:
                on_round(r, debates)
        n_failed = sum(d.failed for d in debates)
        if n_failed:
            log.warning("%d of %d debates failed (see trace.error)", n_failed, len(debates))
        return debates

    def redo_last_round(self, debates: Sequence[Debate], controls: Sequence[RoundControl]) -> None:
        """Drop every given debate's last exchange round and run it again under `controls` (one generate
        call per backend). The dropped turns move to `trace.discarded_rounds`, their tokens to the trace's
        extra tally; the new attempt gets fresh sampling seeds (a same-seed redo would repeat the answer).
        Each round is redone at most once; a failed debate or one still in round 0 cannot be redone."""
        if len(controls) != len(debates):
            raise ValueError(f"redo_last_round: {len(controls)} controls for {len(debates)} debates")
        for d in debates:
            if d.failed or d.round < 1:
                raise ValueError(f"redo_last_round: debate {d.debate_id} is "
                                 f"{'failed' if d.failed else 'still in round 0'}; nothing to redo")
            if any(t.attempt > 0 for t in d.last_turns):
                raise ValueError(f"redo_last_round: round {d.round} of {d.debate_id} was already redone once")
        for d in debates:
            d.trace.drop_last_round()
            d.certainty.pop(d.round, None)
            d.round -= 1
            d.finished = False
            d.trace.set_vote(None)
        self.step(debates, controls, attempt=1)

    def run_concurrent(
        self,
        questions: Sequence[Question],
        protocol,
        max_in_flight: int,
        debate_seeds: Sequence[int] | None = None,
        on_done: Callable[[Debate], None] | None = None,
    ) -> list[Debate]:
        """Run whole debates with up to `max_in_flight` of them at once, each at its own pace.

        `run` moves all debates round by round, so every round waits for its slowest completion while finished
        slots idle. Here a debate starts its next round as soon as its own agents are done, and a new debate
        starts as soon as one ends, which keeps the backend's slots busy. Results are in question order and
        equal to `run`'s for the same seeds (each request's seed depends only on its debate, agent and round).
        The protocol must decide from each debate alone (fixed masks, seeded random masks, the regulator).
        """
        if max_in_flight < 1:
            raise ValueError(f"run_concurrent: max_in_flight must be >= 1, got {max_in_flight}")
        seeds = [default_debate_seed(q) for q in questions] if debate_seeds is None else list(debate_seeds)
        if len(seeds) != len(questions):
            raise ValueError(f"debate_seeds has {len(seeds)} entries for {len(questions)} questions")

        def one(k: int) -> Debate:
            (debate,) = self.run([questions[k]], protocol, [seeds[k]])
            if on_done:
                on_done(debate)
            return debate

        # A stop (KeyboardInterrupt in the main thread, or raised by `on_done` in a worker) cancels every queued
        # debate at once; the `with` then waits for the ones in flight, whose `on_done` still runs.
        with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="debate") as pool:
            futures = [pool.submit(one, k) for k in range(len(questions))]
            try:
                finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
                failed = [f.exception() for f in futures if f in finished and f.exception() is not None]
                if failed:
                    raise failed[0]
                return [f.result() for f in futures]
            finally:
                for f in futures:
                    f.cancel()

    # ------------------------------------------------------------ internals
    def _round0_requests(self, d: Debate, agents: Sequence[int]) -> list[_Pending]:
        """Round-0 requests of `agents`: the question alone, each in its profile's reply style and token limit."""
        cfg = self.config
        by_style: dict[str, list[ChatMessage]] = {}
        out = []
        for i in agents:
            style = self._profile(d, i).style
            if style not in by_style:
                by_style[style] = prompts.round0_messages(d.question, cfg.system_prompt, style)
            out.append(self._request(d, i, 0, by_style[style], cfg.temperature0, cfg.top_p0, [], 0,
                                     self._max_tokens(d, i)))
        return out

    def _request(self, d: Debate, agent: int, round_: int, messages: list[ChatMessage], temperature: float,
                 top_p: float, peers: list[int], truncated: int, max_tokens: int,
                 own_answer: str | None = None, peer_answers: list[str | None] | None = None,
                 guidance: str | None = None, attempt: int = 0, sample: int | None = None) -> _Pending:
        # attempt 0 keeps the historical seed so stored traces and response caches stay valid. Fresh sample n
        # takes the seed of round-0 agent n, so it is the very request a round 0 of n + 1 agents would send
        # (self-consistency's stored samples and the response cache serve it).
        seed_parts = (self.config.seed, d.seed, agent, round_) + ((attempt,) if attempt else ())
        if sample is not None:
            seed_parts = (self.config.seed, d.seed, sample, 0) + ((attempt,) if attempt else ())
        seed = derive_seed(*seed_parts)
        index = sample if sample is not None else (agent if round_ == 0 else None)
        if self.config.shared_prompt and index is not None:  # sample n: sample 0's seed + n
            seed = derive_seed(self.config.seed, d.seed, 0, 0, *((attempt,) if attempt else ())) + index
        req = ChatRequest(
            messages=tuple(messages),
            temperature=float(temperature),
            top_p=float(top_p),
            max_tokens=int(max_tokens),
            seed=seed,
            session=f"{d.debate_id}/agent{agent}",
            logprobs=self.config.logprobs,
            metadata={
                "debate_id": d.debate_id, "question_id": d.question.id, "task": d.question.task,
                "agent": agent, "round": round_, "own_answer": own_answer,
                "peer_answers": list(peer_answers or []), "peers": list(peers),
                "question_text": d.question.question, "attempt": attempt, "fresh": sample is not None,
                # the index among the debate's independent samples (round 0's agents, then fresh turns; a bank
                # world replays its stored sample), None for a revise turn
                "sample": index,
                # only with profiles, so that the paper's requests stay as they were; pool_index = whose profile
                **({"profile": self._profile(d, agent).name, "style": self._profile(d, agent).style,
                    "pool_index": d.pool_index(agent)} if self.config.agent_profiles is not None else {}),
            },
        )
        return _Pending(debate=d, agent=agent, request=req, peers=list(peers), truncated_peers=truncated,
                        guidance=guidance, fresh=sample is not None)

    def _exchange_requests(self, d: Debate, ctl: RoundControl, attempt: int = 0) -> list[_Pending]:
        cfg = self.config
        prev = d.last_turns
        out = []
        r = d.round + 1
        next_sample = d.n_samples
        kinds = [ctl.kinds[i] if ctl.kinds is not None else "revise" for i in range(cfg.n_agents)]
        # a new independent sample is asked for by a fresh turn, or by a waiting agent told to revise (it joins)
        asks = [k == "fresh" or (k == "revise" and prev[i].waiting) for i, k in enumerate(kinds)]
        drawing = self._drawing(d, r, asks)
        for i in range(cfg.n_agents):
            peers = [int(j) for j in np.flatnonzero(ctl.mask[i]) if not prev[j].waiting]
            kind = kinds[i]
            if asks[i] and i not in drawing:
                kind = "keep"  # the debate's sample budget or the round's is spent: no new independent sample
            if prev[i].waiting:  # not answered yet: it joins with a fresh sample, or keeps waiting
                if kind == "keep":
                    out.append(self._waiting(d, i, r))
                    continue
                kind = "fresh"
            if kind == "revise" and cfg.silent and not peers:  # silent turns: reading nobody keeps the answer
                kind = "keep"
            if kind == "keep" and prev[i].error is None:
                out.append(self._silent(d, i, r, ctl))
                continue
            if kind == "fresh":
                messages = prompts.round0_messages(d.question, cfg.system_prompt, self._profile(d, i).style)
                out.append(self._request(d, i, r, messages, ctl.temperature[i], ctl.top_p[i], [], 0,
                                         self._max_tokens(d, i), attempt=attempt, sample=next_sample))
                next_sample += 1
                continue
            guidance = ctl.guidance[i] if ctl.guidance is not None else None
            build = self._prompt_builder(d, i, peers, guidance)
            messages, truncated, max_tokens = self._fit_context(
                d, i, build, self.backends[self._backend_key(d, i)]
            )
            out.append(self._request(
                d, i, r, messages, ctl.temperature[i], ctl.top_p[i], peers, truncated, max_tokens,
                own_answer=prev[i].answer_key, peer_answers=[prev[j].answer_key for j in peers],
                guidance=guidance, attempt=attempt,
            ))
        return out

    def _drawing(self, d: Debate, round_: int, asks: Sequence[bool]) -> set[int]:
        """The agents among those asking for a new independent sample (`asks`) that draw one in round `round_`:
        all, up to the debate's budget (`max_samples`) and the round's (`fresh_per_round`), taken in seat order; with
        a round budget k the order starts at seat (round 0's width + (round - 1) k) mod V, so agents that always ask
        take turns."""
        cfg, v = self.config, self.config.n_agents
        room = cfg.max_samples - d.n_samples if cfg.max_samples is not None else v
        first = 0
        if cfg.fresh_per_round is not None:
            room = min(room, cfg.fresh_per_round)
            first = (cfg.round0_width + (round_ - 1) * cfg.fresh_per_round) % v
        order = [(first + k) % v for k in range(v)]
        return set([i for i in order if asks[i]][:max(room, 0)])

    def _silent(self, d: Debate, agent: int, round_: int, ctl: RoundControl) -> _Pending:
        """A turn that is not sent: the agent reads nobody and keeps its answer (DebateConfig.silent)."""
        p = self._request(d, agent, round_, [], ctl.temperature[agent], ctl.top_p[agent], [], 0, 0,
                          own_answer=d.last_turns[agent].answer_key)
        p.silent = True
        return p

    def _waiting(self, d: Debate, agent: int, round_: int) -> _Pending:
        """A seat whose agent has not answered yet (DebateConfig.start_width): no call, no answer."""
        p = self._request(d, agent, round_, [], self.config.temperature0, self.config.top_p0, [], 0, 0)
        return replace(p, silent=True, waiting=True)

    def _count(self, backend: Backend, messages: Sequence[ChatMessage]) -> int:
        return sum(backend.count_tokens(m.content) + MSG_OVERHEAD_TOKENS for m in messages)

    def _prompt_builder(self, d: Debate, agent: int, peers: list[int], guidance: str | None = None) -> _PromptBuilder:
        """The exchange prompt of `agent` in the debate's next round, in the configured layout."""
        cfg = self.config
        style = self._profile(d, agent).style
        shown = [[_shown(t, show_programs=cfg.show_programs) for t in turns] for turns in d.trace.rounds]
        if cfg.layout == "single":
            own, peer_answers = _shown(d.trace.rounds[-1][agent], to_peer=False), [shown[-1][j] for j in peers]
            n_peer_blocks = len(peers)

            def build(n_cut: int, own_cut: bool) -> list[ChatMessage]:
                return prompts.exchange_messages(d.question, own, peer_answers, n_truncated=n_cut,
                                                 own_truncated=own_cut, system_prompt=cfg.system_prompt,
                                                 guidance=guidance, style=style)
        else:
            # Round k showed agent `agent` the peers recorded in its round-k turn; the new round shows `peers`.
            # A fresh sample starts a new conversation: the exchanges before it are not part of it.
            start = 1 + max((k for k in range(1, len(shown)) if d.trace.rounds[k][agent].fresh), default=0)
            peers_by_round = [d.trace.rounds[k][agent].peers for k in range(1, len(shown))] + [peers]
            guidance_by_round = [d.trace.rounds[k][agent].guidance for k in range(1, len(shown))] + [guidance]
            exchanges = [
                prompts.Exchange(
                    own_text=d.trace.rounds[k - 1][agent].text,
                    own=_shown(d.trace.rounds[k - 1][agent], to_peer=False),
                    peers=tuple(shown[k - 1][j] for j in peers_by_round[k - 1]),
                    guidance=guidance_by_round[k - 1],
                )
                for k in range(start, len(shown) + 1)
                # a silent round-k turn (DebateConfig.silent) was never sent: its exchange is not in the conversation
                if k == len(shown) or not d.trace.rounds[k][agent].silent
            ]
            n_peer_blocks = sum(len(ex.peers) for ex in exchanges)

            def build(n_cut: int, own_cut: bool) -> list[ChatMessage]:
                return prompts.multiturn_messages(d.question, exchanges, n_truncated=n_cut,
                                                  own_truncated=own_cut, system_prompt=cfg.system_prompt, style=style)
        return _PromptBuilder(build, n_peer_blocks)

    def _fit_context(self, d: Debate, agent: int, prompt: _PromptBuilder,
                     backend: Backend) -> tuple[list[ChatMessage], int, int]:
        """Build the exchange prompt; on overflow cut peers' reasoning (oldest first), then the own reasoning,
        then shrink max_tokens (the agent's own limit, DebateConfig.agent_max_tokens). Never raises: a prompt that
        still does not fit goes out and the backend decides."""
        limit = self._max_tokens(d, agent)
        build = prompt.build
        messages = build(0, False)
        ctx = backend.context_length
        if not ctx:
            return messages, 0, limit
        # A (byte-level BPE) token covers at least one UTF-8 byte, so short prompts fit without asking the
        # tokenizer (an HTTP round trip per call on llama.cpp).
        n_bytes = sum(len(m.content.encode()) + MSG_OVERHEAD_TOKENS for m in messages)
        if n_bytes + limit <= ctx:
            return messages, 0, limit
        n_tok = n_tok_full = self._count(backend, messages)
        truncated, own_cut = 0, False
        while n_tok + limit > ctx and truncated < prompt.n_peer_blocks:
            truncated += 1
            messages = build(truncated, False)
            n_tok = self._count(backend, messages)
        if n_tok + limit > ctx:
            own_cut = True
            messages = build(truncated, True)
            n_tok = self._count(backend, messages)
        max_tokens = limit
        if n_tok + max_tokens > ctx:
            max_tokens = max(MIN_MAX_TOKENS, ctx - n_tok)
        if truncated or own_cut or max_tokens != limit:
            self.stats.add(truncations=1)
            log.warning(
                "context overflow in %s agent %d round %d: ~%d prompt tokens + %d max_tokens > %d; "
                "cut reasoning of %d peer(s)%s (~%d prompt tokens left), max_tokens=%d",
                d.debate_id, agent, d.round + 1, n_tok_full, limit, ctx, truncated,
                " and own answer" if own_cut else "", n_tok, max_tokens,
            )
        return messages, truncated, max_tokens

    def _generate_all(self, pending: list[_Pending]) -> list[Completion]:
        """One generate call per distinct backend (concurrently when there are several)."""
        groups: dict[str, list[int]] = {}
        for idx, p in enumerate(pending):
            groups.setdefault(self._backend_key(p.debate, p.agent), []).append(idx)

        def call(key: str) -> tuple[str, list[Completion], float]:
            reqs = [pending[i].request for i in groups[key]]
            t0 = time.perf_counter()
            try:
                comps = self.backends[key].generate(reqs)
                if len(comps) != len(reqs):
                    raise BackendError(
                        f"backend {key!r} returned {len(comps)} completions for {len(reqs)} requests"
                    )
            except Exception as e:  # a whole-batch failure fails these debates, not the process
                log.exception("backend %r failed on a batch of %d requests", key, len(reqs))
                err = f"{type(e).__name__}: {e}"
                comps = [Completion("", 0, 0, "error", 0.0, error=err) for _ in reqs]
            return key, comps, time.perf_counter() - t0

        t0 = time.perf_counter()
        if len(groups) == 1:
            results = [call(next(iter(groups)))]
        else:
            with ThreadPoolExecutor(max_workers=len(groups)) as ex:
                results = list(ex.map(call, groups))
        self.stats.add(backend_s=time.perf_counter() - t0, generate_calls=len(groups), requests=len(pending))
        out: list[Completion | None] = [None] * len(pending)
        for key, comps, _ in results:
            for i, c in zip(groups[key], comps):
                out[i] = c
        return out  # type: ignore[return-value]

    def _execute(self, pending: list[_Pending]) -> None:
        sent = [p for p in pending if not p.silent]
        generated = iter(self._generate_all(sent) if sent else [])
        completions = [Completion("", 0, 0, WAITING, 0.0) if p.waiting
                       else Completion(p.debate.last_turns[p.agent].text, 0, 0, "silent", 0.0) if p.silent
                       else next(generated) for p in pending]
        programs = self._run_programs(pending, completions)
        by_debate: dict[int, list[AgentTurn]] = {}
        debates: dict[int, Debate] = {}
        for k, (p, c) in enumerate(zip(pending, completions)):
            turn = self._make_turn(p, c, programs.get(k))
            by_debate.setdefault(id(p.debate), []).append(turn)
            debates[id(p.debate)] = p.debate
        for key, turns in by_debate.items():
            turns.sort(key=lambda t: t.agent)
            self._record_round(debates[key], turns)

    def _record_round(self, d: Debate, turns: list[AgentTurn]) -> None:
        for t in turns:
            t.answer_key = d.classes.canonical(t.answer_key)
        d.trace.add_round(turns)
        d.round += 1
        errors = [f"agent {t.agent}: {t.error}" for t in turns if t.error is not None]
        if errors:
            d.failed = True
            d.error = f"round {d.round}: " + "; ".join(errors)
            log.warning("debate %s failed: %s", d.debate_id, d.error)
        elif d.round >= d.n_rounds:
            d.finished = True
        if d.done:
            self._finalize(d)

    def _run_programs(self, pending: Sequence[_Pending], completions: Sequence[Completion]) -> dict[int, dict]:
        """The programs of a batch's `pot` turns, run concurrently (PROGRAM_WORKERS at a time, each waiting on its
        own sandboxed process): position -> `pot.PotRun.to_dict()`. Grading stays in the calling thread. A completion
        that brings its run (a bank replay's `Completion.program`) is not run again."""
        jobs = [k for k, (p, c) in enumerate(zip(pending, completions))
                if not p.silent and c.error is None and c.program is None
                and self._profile(p.debate, p.agent).style == pot.STYLE]
        if len(jobs) < 2:  # one program (or none) runs in `_make_turn`
            return {}
        limits = self.config.sandbox_limits
        with ThreadPoolExecutor(max_workers=min(PROGRAM_WORKERS, len(jobs)), thread_name_prefix="pot") as ex:
            runs = list(ex.map(lambda k: pot.run_pot(completions[k].text or "", limits).to_dict(), jobs))
        return dict(zip(jobs, runs))

    def _make_turn(self, p: _Pending, c: Completion, program: dict | None = None) -> AgentTurn:
        """The turn of one completion. `program`: a `pot` turn's program already run (`_run_programs`), else the
        run the completion brings (a bank replay); without either a `pot` turn's program runs here."""
        req = p.request
        self.stats.add(prompt_tokens=c.prompt_tokens, reused_prompt_tokens=c.reused_prompt_tokens,
                       completion_tokens=c.completion_tokens, cached=int(c.cached),
                       fresh_completion_tokens=0 if c.cached else c.completion_tokens)
        text = c.text or ""
        profile = self._profile(p.debate, p.agent)
        if p.waiting:
            graded = GradedTurn(None, None, False, "none", None)
        elif p.silent:  # its answer is the kept turn's as graded then (a cut text stays unanswered)
            kept = p.debate.last_turns[p.agent]
            graded = GradedTurn(kept.answer, kept.answer_key, kept.correct, kept.grader, kept.program)
        else:
            graded = grade_turn(text, c.finish_reason, c.error, p.debate.question, profile.style,
                                limits=self.config.sandbox_limits, program=program or c.program)
        answer, key, correct, grader = graded.astuple()
        if graded.program is not None:
            # a `pot` turn as peers see it: its program and what the program printed (or why it gave no answer);
            # whether peers see the program is decided when they are shown it (`_shown`, show_programs)
            reasoning, conclusion = pot.shown_parts(pot.PotRun.from_dict(graded.program), show_program=True)
        else:
            parsed = prompts.parse_sections(text)
            reasoning, conclusion = parsed.reasoning, parsed.conclusion
        return AgentTurn(
            agent=p.agent, round=int(req.metadata["round"]),
            messages=[{"role": m.role, "content": m.content} for m in req.messages],
            text=text, reasoning=reasoning, conclusion=conclusion,
            answer=answer, answer_key=key, correct=correct, grader=grader,
            temperature=req.temperature, top_p=req.top_p, seed=int(req.seed), peers=p.peers,
            prompt_tokens=int(c.prompt_tokens), completion_tokens=int(c.completion_tokens),
            reused_prompt_tokens=int(c.reused_prompt_tokens),
            finish_reason=c.finish_reason, latency_s=float(c.latency_s), error=c.error,
            truncated_peers=p.truncated_peers, cached=bool(c.cached),
            model_id=self.backends[self._backend_key(p.debate, p.agent)].model_id, max_tokens=req.max_tokens,
            guidance=p.guidance, attempt=int(req.metadata.get("attempt", 0)),
            silent=p.silent, fresh=p.fresh, source=c.source, program=graded.program,
            # a `pot` turn's answer was printed by its program, not written in the text: no answer span to score
            confidence=self._confidence(p, c, text, answer if graded.program is None else None),
            **({"profile": profile.name, "style": profile.style} if self.config.agent_profiles is not None else {}),
        )

    def _confidence(self, p: _Pending, c: Completion, text: str, answer: str | None) -> dict | None:
        """The turn's confidence record when the debate asks for one (None for a silent turn or a failed call).
        `answer`: the answer to find in `text` for `answer_mean` (None for a `pot` turn, whose answer is printed by
        its program: its `answer_mean` is None)."""
        if self.config.logprobs is None or p.silent or c.error is not None:
            return None
        if c.confidence is not None:  # replayed with the completion (a bank's stored record)
            return c.confidence
        missing = ("served from the response cache without log-probabilities" if c.cached
                   else f"{self.backends[self._backend_key(p.debate, p.agent)].model_id} sent no log-probabilities")
        return confidence_dict(c.logprobs, text, answer, missing)

    def _finalize(self, d: Debate) -> None:
        tr = d.trace
        tr.failed, tr.error = d.failed, d.error
        tr.decision = d.decision  # every rule is recorded, the last round too: a re-grade never guesses it
        tr.vote_tau = d.vote_tau if d.decision == "confidence-weighted" else None
        if d.failed:
            # A failed debate has no trustworthy final answer: it counts as wrong and is reported as failed.
            tr.set_vote(None)
            return
        if d.decision == "belief-weighted":
            self.weigher([d])
        tr.set_vote(d.vote(d.decision))


# ---------------------------------------------------------------- summaries
@dataclass
class RunSummary:
    n: int
    accuracy: float  # mean expected correctness over tied leaders (dear.vote's tie rule)
    correct: int  # debates whose seeded pick is correct
    failed: int
    ties: int
    no_answer_turns: int
    turns: int
    prompt_tokens: int
    completion_tokens: int
    cached_turns: int
    tokens_per_question: float = field(init=False)

    def __post_init__(self):
        self.tokens_per_question = (self.prompt_tokens + self.completion_tokens) / max(1, self.n)


def summarize(debates: Sequence[Debate]) -> RunSummary:
    turns = [t for d in debates for r in d.trace.rounds for t in r]
    correct = sum(d.trace.final_correct for d in debates)
    return RunSummary(
        n=len(debates),
        accuracy=sum(d.trace.final_expected for d in debates) / max(1, len(debates)),
        correct=correct,
        failed=sum(d.failed for d in debates),
        ties=sum(d.trace.tie for d in debates),
        no_answer_turns=sum(t.answer is None and t.error is None for t in turns),
        turns=len(turns),
        prompt_tokens=sum(d.trace.prompt_tokens for d in debates),
        completion_tokens=sum(d.trace.completion_tokens for d in debates),
        cached_turns=sum(t.cached for t in turns),
    )
