"""Debate protocols: who reads whom and how each agent samples in every exchange round.

A protocol has `n_rounds` (exchange rounds after round 0) and `controls(debates) -> list[RoundControl]`, one
control per debate for its next round. The RL-regulated protocol (floor 3) implements the same interface.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np

from dear.debate.engine import Debate, DebateConfig, RoundControl
from dear.seeds import derive_seed


class Protocol(abc.ABC):
    name: str = "protocol"
    n_rounds: int = 0

    @abc.abstractmethod
    def controls(self, debates: Sequence[Debate]) -> list[RoundControl]: ...


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


PROTOCOLS = ("mad", "majority", "random", "self", "fixed")


def make_protocol(name: str, config: DebateConfig, **kwargs) -> Protocol:
    """Build a protocol by name: `mad`, `majority`, `random` / `random:<p>`, `self` (no peers: self-refine),
    `fixed` (needs mask=...). Sampling defaults to the config's round-0 temperature/top-p."""
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
    elif base == "fixed":
        if "mask" not in kwargs:
            raise ValueError("protocol 'fixed' needs mask=<(V, V) bool array>")
        proto = FixedMaskProtocol(kwargs.pop("mask"), n_rounds, t, p)
    else:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}")
    if kwargs:
        raise ValueError(f"make_protocol({name!r}): unexpected arguments {sorted(kwargs)}")
    return proto
