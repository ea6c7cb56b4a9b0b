"""The method catalog: every method the evaluation harness runs and the server answers with, one entry each.

An entry (`MethodSpec`) names the method, its label in reports, its kind, a one-line help, whether it is a baseline,
and how it is built:

- `single` / `debate`: `build` makes its protocol (MajorityProtocol for single CoT, a protocol class of
  `dear.debate.protocols` for MAD and its kin) on the config `MethodSpec.config_for` gives; `eval.methods` and
  `dear.serve.methods` both call `MethodSpec.make`;
- `samples`: independent samples and a vote. eval reads them off its stored round 0 (`rule`: a rule of
  `dear.debate.sampling_rules`, else the first n); `build` draws them live (the server's): a rule through
  `SamplingRuleProtocol`, which stops where the rule's replay on the same samples stops;
- `dear`: the policy (floor 3: `dear.regulator`) with its ablation switches; built by the applications.

The server answers with DEAR, every method of `--methods all` that has a `build`, and every rule. A `baseline` (k >= 1)
is one the report pairs every other method with, as its k-th paired table. The confidence rules (`cisc-3`,
`confident-stop`) read the samples' confidences (their round 0 asks for log-probabilities) with parameters fitted on
GSM8K train questions (`sampling_rules.FittedParams`, `DEFAULT_RULE_PARAMS`); they are asked for by name, not by
`all`, since a backend without log-probabilities (the sim backend) cannot run them.

Adding a baseline: a protocol class (dear/debate/protocols.py) and one entry below, with `build=` and, for the
report's paired tables, `baseline=`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from dear.debate.engine import DebateConfig
from dear.debate.protocols import (
    MajorityProtocol,
    Protocol,
    SamplingRuleProtocol,
    SelfConsistencyProtocol,
    StopWhenUnanimousProtocol,
    make_protocol,
)
from dear.debate.sampling_rules import DEFAULT_PARAMS, CONFIDENT_STOP, FittedParams, RuleParams, is_weighted

Kind = Literal["single", "samples", "debate", "dear"]
# (the method, its config, the self-consistency samples, its rule's parameters) -> the protocol that runs it live
Builder = Callable[["MethodSpec", DebateConfig, int, RuleParams], Protocol]
DEAR = "dear"


@dataclass(frozen=True)
class MethodSpec:
    name: str
    label: str  # how the report prints it
    kind: Kind
    description: str
    baseline: int = 0  # 0: not a baseline; k >= 1: the report's k-th "paired difference to" table
    build: Builder | None = field(default=None, compare=False, repr=False)  # None: the applications build it
    protocol: str = ""  # a debate built by `make_protocol` name
    in_all: bool = True  # run by `--methods all`
    selection_mode: str = "learned"  # dear kind: JointPolicy overrides
    behavior_mode: str = "learned"
    fusion: str = "dst"
    ablates: str = ""  # the method this one is an ablation or control of (the report pairs the two)
    rule: str = ""  # samples kind: an adaptive rule of dear.debate.sampling_rules over the stored round 0

    @property
    def needs_checkpoint(self) -> bool:
        return self.kind == "dear"

    @property
    def exchanges(self) -> bool:
        """Whether its later rounds show peers' answers (a debate), rather than draw fresh samples or none."""
        return self.kind in ("debate", "dear")

    def config_for(self, base: DebateConfig) -> DebateConfig:
        """The debate config the method runs with: single CoT is a one-agent round 0."""
        return replace(base, n_agents=1, n_rounds=0) if self.kind == "single" else base

    @property
    def reads_confidence(self) -> bool:
        """Whether it weighs or stops by the samples' confidences (its debates must ask for log-probabilities)."""
        return bool(self.rule) and is_weighted(self.rule)

    def make(self, base: DebateConfig, samples: int,
             fitted: FittedParams | None = None) -> tuple[DebateConfig, Protocol]:
        """The config and protocol that run the method live on `base`'s agents, rounds and round-0 sampling
        (`samples`: the self-consistency samples; `fitted`: the confidence rules' parameters, needed by those)."""
        if self.build is None:
            raise ValueError(f"method {self.name!r} ({self.kind}) has no protocol of its own in the catalog")
        if self.reads_confidence and fitted is None:
            raise ValueError(f"method {self.name!r} needs fitted rule parameters (sampling_rules.FittedParams)")
        params = fitted.of(self.rule) if fitted is not None else DEFAULT_PARAMS
        proto = self.build(self, self.config_for(base), samples, params)
        return proto.configure(self.config_for(base)), proto


def _plurality(spec: MethodSpec, config: DebateConfig, samples: int, params: RuleParams) -> Protocol:
    """Round 0's answers and their plurality, no exchange (named after the method)."""
    proto = MajorityProtocol()
    proto.name = spec.name
    return proto


def _self_consistency(spec: MethodSpec, config: DebateConfig, samples: int, params: RuleParams) -> Protocol:
    return SelfConsistencyProtocol(config.n_agents, samples, config.temperature0, config.top_p0)


def _named(spec: MethodSpec, config: DebateConfig, samples: int, params: RuleParams) -> Protocol:
    return make_protocol(spec.protocol, config)


def _stop_when_unanimous(spec: MethodSpec, config: DebateConfig, samples: int, params: RuleParams) -> Protocol:
    return StopWhenUnanimousProtocol(config.n_agents, config.n_rounds, config.temperature0, config.top_p0)


def _sampling_rule(spec: MethodSpec, config: DebateConfig, samples: int, params: RuleParams) -> Protocol:
    """The rule drawn live: its first samples, then one a round until it stops (at most `samples`)."""
    return SamplingRuleProtocol(spec.rule, config.n_agents, samples, config.temperature0, config.top_p0, params)


def _adaptive(agree: int, start: int | None = None) -> MethodSpec:
    """Adaptive self-consistency until `agree` share an answer, from the debates' V samples or from `start`."""
    if start is None:
        return MethodSpec(
            f"adaptive-sc-{agree}", f"Adaptive SC (until {agree} agree)", "samples",
            f"adaptive self-consistency: V samples, then one more at a time until {agree} share an answer (at most "
            "the self-consistency samples); plurality over those used", rule=f"adaptive-sc-{agree}",
            baseline={2: 4, 3: 5}[agree], build=_sampling_rule)
    return MethodSpec(
        f"adaptive-sc-{agree}-from-{start}", f"Adaptive SC (from {start}, until {agree} agree)", "samples",
        f"adaptive self-consistency started at {start} sample(s): one more at a time until {agree} share an answer "
        "(at most the self-consistency samples); plurality over those used", rule=f"adaptive-sc-{agree}-from-{start}",
        baseline=6 if (agree, start) == (2, 2) else 0, build=_sampling_rule)


def _esc(window: int) -> MethodSpec:
    return MethodSpec(f"esc-{window}", f"ESC (window {window})", "samples",
                      f"early-stopping self-consistency: windows of {window} samples until one window is unanimous "
                      "(at most the self-consistency samples); plurality over every sample drawn", rule=f"esc-{window}",
                      build=_sampling_rule)


# The order is `--methods all`'s and the reports' row order; `baseline` orders the paired tables.
METHODS: dict[str, MethodSpec] = {
    m.name: m
    for m in (
        MethodSpec("cot", "Single CoT", "single", "one agent, one answer (= agent 0 of round 0)", baseline=7,
                   build=_plurality),
        MethodSpec("sc", "CoT-SC", "samples", "self-consistency: n independent samples, plurality vote", baseline=3,
                   build=_self_consistency),
        MethodSpec("majority", "Round-0 majority", "samples", "V independent answers, plurality, no exchange",
                   baseline=2, build=_plurality),
        *(_adaptive(a) for a in (2, 3)),
        *(_adaptive(a, s) for a in (2, 3) for s in (1, 2)),
        *(_esc(w) for w in (2, 3)),
        MethodSpec("cisc-3", "CISC (3 samples)", "samples",
                   "confidence-informed self-consistency: V=3 samples, each voting with weight softmax(mean token "
                   "log-probability / tau), tau fitted on GSM8K train", rule="cisc-3", in_all=False,
                   build=_sampling_rule),
        MethodSpec(CONFIDENT_STOP, "Confident stop", "samples",
                   "one sample; stop when its mean token log-probability clears a threshold fitted on GSM8K train, "
                   "else draw until 2 agree (at most the self-consistency samples) and vote with CISC weights",
                   rule=CONFIDENT_STOP, in_all=False, build=_sampling_rule),
        MethodSpec("mad", "MAD", "debate", "full mask, fixed sampling", baseline=1, build=_named, protocol="mad"),
        MethodSpec("mad-stop", "MAD stop-when-unanimous", "debate",
                   "MAD that ends as soon as all agents give the same answer (after round 0 or any later round)",
                   build=_stop_when_unanimous),
        # a mixed pool's hand rule, MAD on a pool of one profile: asked for by name, not by `all`
        MethodSpec("read-strongest", "Everyone reads the strongest", "debate",
                   "a mixed pool's hand rule: every agent reads the other agents of the first agent's profile "
                   "(list the strongest first) and nobody else, MAD's sampling; one profile = MAD",
                   build=_named, protocol="read-strongest", in_all=False),
        MethodSpec(DEAR, "DEAR", "dear", "learned selection + learned behavior, DST fusion"),
        MethodSpec("dear-no-selection", "DEAR w/o selection", "dear", "full mask + learned behavior",
                   selection_mode="full", ablates=DEAR),
        MethodSpec("dear-no-behavior", "DEAR w/o behavior", "dear", "learned selection + fixed sampling",
                   behavior_mode="fixed", ablates=DEAR),
        MethodSpec("dear-mean", "DEAR Mean-fusion", "dear", "mean of selected opinions instead of DST",
                   fusion="mean", ablates=DEAR),
        MethodSpec("dear-random-mask", "DEAR random-mask", "dear",
                   "random mask whose per-round density is DEAR's realized density on the benchmark "
                   "+ learned behavior (an extended policy: stop, kinds and a reviser's pairs drawn at DEAR's "
                   "per-round frequencies)", selection_mode="random", ablates=DEAR),
    )
}
DEFAULT_METHODS = tuple(n for n, s in METHODS.items() if s.in_all)
# The baselines the report pairs every method with, in the order of its tables.
BASELINES = tuple(s.name for s in sorted((s for s in METHODS.values() if s.baseline), key=lambda s: s.baseline))
# The server's methods besides DEAR: those of `--methods all` the catalog builds live, and every sampling rule.
SERVED = tuple(n for n, s in METHODS.items() if s.build is not None and (s.in_all or s.rule))


def _check_catalog() -> None:
    ranks = [s.baseline for s in METHODS.values() if s.baseline]
    if sorted(ranks) != list(range(1, len(ranks) + 1)):
        raise ValueError(f"method catalog: baseline ranks must be 1..{len(ranks)} once each, got {sorted(ranks)}")
    for s in METHODS.values():
        if s.ablates and s.ablates not in METHODS:
            raise ValueError(f"method catalog: {s.name!r} ablates unknown method {s.ablates!r}")
        if (s.kind in ("single", "debate") and s.build is None) or (s.kind == "dear" and s.build is not None):
            raise ValueError(f"method catalog: {s.name!r}: a {s.kind} method "
                             f"{'needs' if s.build is None else 'takes no'} build")


_check_catalog()
