"""Debate protocols: who reads whom and how each agent samples in every exchange round.

A protocol has `n_rounds` (exchange rounds after round 0) and `controls(debates) -> list[RoundControl]`, one
control per debate for its next round. The RL-regulated protocol (floor 3) implements the same interface.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from dear.confidence import TOP_LOGPROBS
from dear.debate.engine import Debate, DebateConfig, RoundControl
from dear.debate.profiles import without_backend
from dear.debate.sampling_rules import DEFAULT_PARAMS, RuleParams, Samples, is_weighted, rule_done, rule_start
from dear.seeds import derive_seed


class Protocol(abc.ABC):
    name: str = "protocol"
    n_rounds: int = 0

    @abc.abstractmethod
    def controls(self, debates: Sequence[Debate]) -> list[RoundControl]: ...

    def configure(self, config: DebateConfig) -> DebateConfig:
        """The debate config this protocol runs in, from the one it is given (unchanged unless it needs more)."""
        return config


class FixedMaskProtocol(Protocol):
    """The same mask and sampling for every debate and round."""

    name = "fixed"

    def __init__(self, mask, n_rounds: int = 2, temperature: float | Sequence[float] = 0.7,
                 top_p: float | Sequence[float] = 0.9):
        mask = np.asarray(mask, dtype=bool)
        self.control = RoundControl(mask, temperature, top_p)  # validates
        self.n_rounds = int(n_rounds)

    def controls(self, debates: Sequence[Debate]) -> list[RoundControl]:
        c = self.control
        return [RoundControl(c.mask.copy(), c.temperature.copy(), c.top_p.copy()) for _ in debates]


class MADProtocol(FixedMaskProtocol):
    """Classic multi-agent debate: everyone reads everyone, fixed sampling."""

    name = "mad"

    def __init__(self, n_agents: int = 3, n_rounds: int = 2, temperature: float = 0.7, top_p: float = 0.9):
        super().__init__(~np.eye(n_agents, dtype=bool), n_rounds, temperature, top_p)


class MajorityProtocol(Protocol):
    """Round-0 majority vote: independent answers, no exchange."""

    name = "majority"
    n_rounds = 0

    def controls(self, debates: Sequence[Debate]) -> list[RoundControl]:
        if any(not d.done for d in debates):
            raise RuntimeError("MajorityProtocol has no exchange rounds; debates should be done after round 0")
        return []


class RandomMaskProtocol(Protocol):
    """Each ordered pair i<-j is shown with probability p, drawn per debate and round (seeded)."""

    name = "random"

    def __init__(self, p: float = 0.5, seed: int = 0, n_agents: int = 3, n_rounds: int = 2,
                 temperature: float = 0.7, top_p: float = 0.9):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomMaskProtocol.p must be in [0, 1], got {p}")
        self.p, self.seed, self.n_agents, self.n_rounds = float(p), int(seed), int(n_agents), int(n_rounds)
        self.temperature, self.top_p = float(temperature), float(top_p)

    def controls(self, debates: Sequence[Debate]) -> list[RoundControl]:
        out = []
        v = self.n_agents
        for d in debates:
            # Depends only on (seed, debate, round) so a debate's masks do not change with batch composition.
            rng = np.random.default_rng(derive_seed(self.seed, d.seed, d.round + 1, 0xA11))
            mask = (rng.random((v, v)) < self.p) & ~np.eye(v, dtype=bool)
            out.append(RoundControl(mask, np.full(v, self.temperature), np.full(v, self.top_p)))
        return out


# ---------------------------------------------------------------- the strong baselines as regulator settings
# Each is a choice of turn kinds, a stop and a decision rule (RoundControl.kinds / .stop, Debate.decision): the
# actions the extended regulator can take, so a learner over them contains these baselines.
def _control(n_agents: int, temperature: float, top_p: float, kinds=None, stop: bool = False,
             mask=None) -> RoundControl:
    mask = np.zeros((n_agents, n_agents), dtype=bool) if mask is None else mask
    return RoundControl(mask, temperature, top_p, kinds=kinds, stop=stop)


def unanimous(keys) -> bool:
    """Every agent gave the same parsed answer (no answer is never unanimous)."""
    return bool(keys) and keys[0] is not None and all(k == keys[0] for k in keys)


class StopWhenUnanimousProtocol(Protocol):
    """MAD that stops after the first round (0, 1, …) where every agent gave the same answer (MAD-stop).
    `always=True` stops after round 0 whatever happened: the round-0 majority."""

    def __init__(self, n_agents: int = 3, n_rounds: int = 2, temperature: float = 0.7, top_p: float = 0.9,
                 always: bool = False):
        self.n_agents, self.n_rounds, self.temperature, self.top_p = int(n_agents), int(n_rounds), temperature, top_p
        self.always = bool(always)
        self.name = "majority-stop" if always else "mad-stop"

    def controls(self, debates: Sequence[Debate]) -> list[RoundControl]:
        full = ~np.eye(self.n_agents, dtype=bool)
        return [_control(self.n_agents, self.temperature, self.top_p, mask=full,
                         stop=self.always or unanimous(d.answer_keys)) for d in debates]


class SelfConsistencyProtocol(Protocol):
    """Self-consistency with `n_samples` samples: every agent draws fresh samples, round after round, until the
    debate holds n; the plurality over all of them decides. Fresh sample k is the request round-0 agent k of a
    wider debate sends, so this reproduces a round 0 of n agents."""

    name = "sc"
    decision = "all-answers"

    def __init__(self, n_agents: int = 3, n_samples: int = 9, temperature: float = 0.7, top_p: float = 0.9):
        if n_samples < n_agents:
            raise ValueError(f"n_samples ({n_samples}) must be >= n_agents ({n_agents})")
        self.n_agents, self.n_samples, self.temperature, self.top_p = int(n_agents), int(n_samples), temperature, top_p
        self.n_rounds = -(-(self.n_samples - self.n_agents) // self.n_agents)

    def controls(self, debates: Sequence[Debate]) -> list[RoundControl]:
        out = []
        for d in debates:
            left = self.n_samples - d.n_samples
            kinds = tuple("fresh" if i < left else "keep" for i in range(self.n_agents))
            out.append(_control(self.n_agents, self.temperature, self.top_p, kinds, stop=left <= 0))
        return out


class SamplingRuleProtocol(Protocol):
    """A sampling rule of `dear.debate.sampling_rules` (adaptive SC, ESC, CISC, confident stop, ...) run live: round 0
    draws the rule's first samples (`rule_start`; the config's `start_width` must match `start_width` here), then one
    fresh sample a round, the agents taking turns, until the rule stops (`rule_done`: where its replay on the same
    samples stops) or `max_samples` exist. The vote is over every sample drawn, weighted by the model's confidence for
    the rules that weigh (`cisc-K`, `confident-stop`: decision "confidence-weighted", temperature `params.tau`).
    Fresh sample k sends round-0 agent k's request, so on a backend whose answer depends only on the request this
    draws the very samples the rule reads off a stored round 0 of width `max_samples`."""

    def __init__(self, rule: str, n_agents: int = 3, max_samples: int = 9, temperature: float = 0.7,
                 top_p: float = 0.9, params: RuleParams = DEFAULT_PARAMS):
        first = rule_start(rule, n_agents)  # ValueError for an unknown rule
        if not 1 <= first <= max_samples:
            raise ValueError(f"rule {rule!r} draws {first} samples first; max_samples is {max_samples}")
        self.rule, self.params, self.n_agents, self.max_samples = rule, params, int(n_agents), int(max_samples)
        self.temperature, self.top_p = temperature, top_p
        self.start_width = min(first, self.n_agents)  # round 0's answers (DebateConfig.start_width)
        self.n_rounds = self.max_samples - self.start_width
        self.name = rule
        self.decision = "confidence-weighted" if is_weighted(rule) else "all-answers"

    def configure(self, config: DebateConfig) -> DebateConfig:
        """`config` with the rule's round-0 width, its vote temperature, and log-probabilities asked for when the
        rule reads confidences."""
        logprobs = TOP_LOGPROBS if is_weighted(self.rule) and config.logprobs is None else config.logprobs
        return replace(config, start_width=self.start_width, vote_tau=self.params.tau, logprobs=logprobs)

    def done(self, debate: Debate) -> bool:
        """Whether the rule stops at the debate's samples (or no sample is left to draw)."""
        drawn = Samples.of_turns(debate.voters("all-answers"))
        return len(drawn.keys) >= self.max_samples or rule_done(drawn, self.rule, self.n_agents, self.params)

    def controls(self, debates: Sequence[Debate]) -> list[RoundControl]:
        out = []
        for d in debates:
            answered = sum(not t.waiting for t in d.trace.rounds[0])
            if d.round == 0 and answered != self.start_width:
                raise ValueError(f"rule {self.rule!r} draws {self.start_width} sample(s) in round 0, the debate drew "
                                 f"{answered}: run it with DebateConfig.start_width={self.start_width}")
            turn = d.n_samples % self.n_agents  # the agents take turns drawing
            kinds = tuple("fresh" if i == turn else "keep" for i in range(self.n_agents))
            out.append(_control(self.n_agents, self.temperature, self.top_p, kinds, stop=self.done(d)))
        return out


PROTOCOLS = ("mad", "majority", "random", "self", "fixed", "read-strongest")


def read_strongest_mask(config: DebateConfig, strongest: str = "") -> np.ndarray:
    """The hand rule for a mixed pool: every agent reads the other agents whose profile is `strongest` (default the
    first agent's; a name without its backend matches any backend) and nobody else. One profile: the full mesh."""
    v = config.n_agents
    names = [config.profile(i).name for i in range(v)]
    target = strongest or names[0]
    chosen = [n == target or without_backend(n) == target for n in names]
    if not any(chosen):
        raise ValueError(f"read-strongest: no agent has the profile {target!r}; the pool is {names}")
    return np.array([[chosen[j] and i != j for j in range(v)] for i in range(v)], dtype=bool)


def make_protocol(name: str, config: DebateConfig, **kwargs) -> Protocol:
    """Build a protocol by name: `mad`, `majority`, `random` / `random:<p>`, `self` (no peers: self-refine),
    `fixed` (needs mask=...), `read-strongest` / `read-strongest:<profile>` (read_strongest_mask). Sampling
    defaults to the config's round-0 temperature/top-p."""
    base, _, arg = name.partition(":")
    t = kwargs.pop("temperature", config.temperature0)
    p = kwargs.pop("top_p", config.top_p0)
    n_rounds = kwargs.pop("n_rounds", config.n_rounds)
    v = config.n_agents
    if base == "mad":
        proto: Protocol = MADProtocol(v, n_rounds, t, p)
    elif base == "majority":
        proto = MajorityProtocol()
    elif base == "random":
        prob = float(arg) if arg else kwargs.pop("p", 0.5)
        proto = RandomMaskProtocol(prob, kwargs.pop("seed", config.seed), v, n_rounds, t, p)
    elif base == "self":
        proto = FixedMaskProtocol(np.zeros((v, v), dtype=bool), n_rounds, t, p)
        proto.name = "self"
    elif base == "read-strongest":
        proto = FixedMaskProtocol(read_strongest_mask(config, arg), n_rounds, t, p)
        proto.name = "read-strongest"
    elif base == "fixed":
        if "mask" not in kwargs:
            raise ValueError("protocol 'fixed' needs mask=<(V, V) bool array>")
        proto = FixedMaskProtocol(kwargs.pop("mask"), n_rounds, t, p)
    else:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}")
    if kwargs:
        raise ValueError(f"make_protocol({name!r}): unexpected arguments {sorted(kwargs)}")
    return proto
