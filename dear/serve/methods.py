"""The debate methods the server answers with, one per `model` name: DEAR (the policy) and the baselines.

The names are the evaluation harness's (`eval/methods.py`, which the server cannot import: it is on the
same floor), and each method is the same debate the harness runs, on the server's settings (V agents,
R exchange rounds, `--max-tokens` per turn, round 0 at `--temperature`/`--top-p`):

- `dear`: the exported policy regulates rounds 1..R (who reads whom, each agent's sampling);
- `mad`: every agent reads every peer for R rounds at the round-0 sampling;
- `mad-stop`: MAD that ends after the first round in which every agent gave the same answer;
- `sc`: self-consistency with V * (R + 1) samples (MAD's call budget, the harness's default): each
  exchange round draws V fresh samples from the question alone, and the plurality over all samples decides;
- `cot`: one agent, one answer (round 0 of a one-agent debate);
- `majority`: the plurality of round 0's V independent answers, no exchange.

Every method runs on an engine over one shared backend (`SharedBatch`), so the scheduler advances all of
them in one batched backend call per step. With agent profiles (`--agent-profiles`, dear/debate/profiles.py)
every method's agents take them as the harness's do: agent i profile i, single CoT agent 0, self-consistency's
samples the pool in order; a backend a profile names besides `--llm` is called by each engine directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dear.debate.engine import DECISIONS, DebateConfig, DebateEngine
from dear.debate.protocols import (
    MADProtocol,
    MajorityProtocol,
    SelfConsistencyProtocol,
    StopWhenUnanimousProtocol,
)
from dear.infer import RegulatedDebater
from dear.llm.base import Backend

DEAR = "dear"
# Served method names and what each does (also GET /v1/models' order); DEAR's can be renamed (--model-name).
METHODS: dict[str, str] = {
    DEAR: "DEAR: the policy regulates who reads whom and each agent's sampling",
    "mad": "multi-agent debate: everyone reads everyone, fixed sampling",
    "mad-stop": "MAD that stops after the first round in which every agent gives the same answer",
    "sc": "self-consistency: V * (R + 1) independent samples, plurality over all of them",
    "cot": "single chain of thought: one agent, one answer",
    "majority": "round-0 majority: V independent answers, plurality, no exchange",
}


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one object per served method
class ServedMethod:
    """One served method: the engine its debates run on and the protocol that steers their rounds."""

    name: str
    engine: DebateEngine
    protocol: Any  # Protocol or RegulatedProtocol: `name`, `n_rounds`, `controls(debates)`
    # Whether exchange rounds show peers' answers (the prompt grows round by round), which the context check
    # must allow for; self-consistency's later rounds are fresh samples with round 0's prompt.
    exchanges: bool

    @property
    def config(self) -> DebateConfig:
        return self.engine.config

    @property
    def n_agents(self) -> int:
        return self.config.n_agents

    @property
    def n_rounds(self) -> int:
        """Exchange rounds planned after round 0 (a protocol may stop earlier)."""
        return int(self.protocol.n_rounds)

    @property
    def decision(self) -> str:
        """How the final answer is decided (engine DECISIONS): the protocol's own rule, else the last round's."""
        return getattr(self.protocol, "decision", DECISIONS[0])

    @property
    def turn_limits(self) -> list[int]:
        """Each agent's completion limit per turn: its profile's, else the server's --max-tokens."""
        return [self.config.agent_max_tokens(i) for i in range(self.n_agents)]

    @property
    def round_worst_case(self) -> int:
        """The most completion tokens one round can take: every agent's call at its per-turn limit."""
        return sum(self.turn_limits)

    @property
    def agent_profiles(self) -> list[str] | None:
        """Each agent's profile in its compact form (e.g. `smoke:direct:64`); None without profiles."""
        cfg = self.config
        return None if cfg.agent_profiles is None else [cfg.profile(i).name for i in range(self.n_agents)]


def served_names(dear_name: str = DEAR) -> dict[str, str]:
    """Model name -> method name; DEAR is served under `dear_name`."""
    if dear_name != DEAR and dear_name in METHODS:
        raise ValueError(f"the model name {dear_name!r} is a baseline's; choose another (served: "
                         f"{', '.join(METHODS)})")
    return {(dear_name if m == DEAR else m): m for m in METHODS}


def build_methods(debater: RegulatedDebater, backend: Backend) -> Mapping[str, ServedMethod]:
    """Every method of METHODS on `backend` (the debater's, wrapped so the engines share its batches) and the
    other backends the debater's profiles name, with the debater's settings (its profiles among them). Methods
    whose configs are equal share one engine."""
    dear_cfg = debater.config
    # The policy may run with silent turns (trained so); the baselines run as the harness runs them.
    base = replace(dear_cfg, silent=False)
    engines: dict[DebateConfig, DebateEngine] = {}

    def engine(cfg: DebateConfig) -> DebateEngine:
        if cfg not in engines:
            engines[cfg] = DebateEngine(debater.backends(backend), cfg, weigher=debater.weigher)
        return engines[cfg]

    v, r, t, p = base.n_agents, base.n_rounds, base.temperature0, base.top_p0
    cot, majority = MajorityProtocol(), MajorityProtocol()
    cot.name, majority.name = "cot", "majority"
    return {
        DEAR: ServedMethod(DEAR, engine(dear_cfg), debater.protocol(), exchanges=True),
        "mad": ServedMethod("mad", engine(base), MADProtocol(v, r, t, p), exchanges=True),
        "mad-stop": ServedMethod("mad-stop", engine(base), StopWhenUnanimousProtocol(v, r, t, p), exchanges=True),
        "sc": ServedMethod("sc", engine(base), SelfConsistencyProtocol(v, v * (r + 1), t, p), exchanges=False),
        "cot": ServedMethod("cot", engine(replace(base, n_agents=1, n_rounds=0)), cot, exchanges=False),
        "majority": ServedMethod("majority", engine(base), majority, exchanges=False),
    }
