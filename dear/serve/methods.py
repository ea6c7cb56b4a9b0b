"""The debate methods the server answers with, one per `model` name: DEAR (the policy) and the baselines.

The methods are the catalog's (`dear.debate.methods`: DEAR and every method of `--methods all` that the catalog
builds live, `SERVED`), each the same debate the evaluation harness runs, on the server's settings (V agents,
R exchange rounds, `--max-tokens` per turn, round 0 at `--temperature`/`--top-p`):

- `dear`: the exported policy regulates rounds 1..R (who reads whom, each agent's sampling);
- `cot`: one agent, one answer (round 0 of a one-agent debate);
- `sc`: self-consistency with V * (R + 1) samples (MAD's call budget, the harness's default): each
  exchange round draws V fresh samples from the question alone, and the plurality over all samples decides;
- `majority`: the plurality of round 0's V independent answers, no exchange;
- `mad`: every agent reads every peer for R rounds at the round-0 sampling;
- `mad-stop`: MAD that ends after the first round in which every agent gave the same answer;
- the sampling rules (`adaptive-sc-A`, `adaptive-sc-A-from-S`, `esc-W`, `cisc-3`, `confident-stop`): the rule's first
  samples, then one fresh sample a round until it stops (at most V * (R + 1)); the confidence rules ask for
  log-probabilities and run with the parameters fitted on GSM8K train (`DEFAULT_RULE_PARAMS`).

Every method runs on an engine over one shared backend (`SharedBatch`), so the scheduler advances all of
them in one batched backend call per step. With agent profiles (`--agent-profiles`, dear/debate/profiles.py)
every method's agents take them as the harness's do: agent i profile i, single CoT agent 0, self-consistency's
samples the pool in order; a backend a profile names besides `--llm` is called by each engine directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dear.debate.engine import DebateConfig, DebateEngine
from dear.debate.methods import DEAR, METHODS, SERVED
from dear.debate.sampling_rules import DEFAULT_RULE_PARAMS, FittedParams
from dear.infer import RegulatedDebater
from dear.llm.base import Backend

# Served method names, in GET /v1/models' order; DEAR's can be renamed (--model-name).
SERVED_METHODS = (DEAR, *SERVED)


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
        """How the final answer is decided (engine DECISIONS): the protocol's own rule, else its engine's (a DEAR
        policy's: the rule it was trained with, `RegulatedDebater.config`)."""
        return getattr(self.protocol, "decision", None) or self.config.decision

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
    if dear_name != DEAR and dear_name in SERVED_METHODS:
        raise ValueError(f"the model name {dear_name!r} is a baseline's; choose another (served: "
                         f"{', '.join(SERVED_METHODS)})")
    return {(dear_name if m == DEAR else m): m for m in SERVED_METHODS}


def build_methods(debater: RegulatedDebater, backend: Backend,
                  fitted: FittedParams | None = None) -> Mapping[str, ServedMethod]:
    """Every served method on `backend` (the debater's, wrapped so the engines share its batches) and the
    other backends the debater's profiles name, with the debater's settings (its profiles among them): DEAR with
    the debater's protocol, the others as the catalog builds them (the confidence rules with `fitted`, by default
    the committed fit `DEFAULT_RULE_PARAMS`). Methods whose configs are equal share one engine."""
    if fitted is None and any(METHODS[name].reads_confidence for name in SERVED):
        fitted = FittedParams.load(DEFAULT_RULE_PARAMS)
    dear_cfg = debater.config
    # The policy may run with silent turns and vote by the rule it was trained with; the baselines run as the
    # harness runs them (each protocol's own rule, else the paper's last round).
    base = replace(dear_cfg, silent=False, decision=DebateConfig.decision)
    engines: dict[DebateConfig, DebateEngine] = {}

    def engine(cfg: DebateConfig) -> DebateEngine:
        if cfg not in engines:
            engines[cfg] = DebateEngine(debater.backends(backend), cfg, weigher=debater.weigher)
        return engines[cfg]

    samples = base.n_agents * (base.n_rounds + 1)  # self-consistency at MAD's call budget
    methods = {DEAR: ServedMethod(DEAR, engine(dear_cfg), debater.protocol(), exchanges=True)}
    for name in SERVED:
        spec = METHODS[name]
        config, protocol = spec.make(base, samples, fitted)
        methods[name] = ServedMethod(name, engine(config), protocol, exchanges=spec.exchanges)
    return methods
