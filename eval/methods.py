"""Evaluation methods: what eval alone builds around the method catalog (`dear.debate.methods`): the methods over
the stored round 0, DEAR from a checkpoint with its density-matched control, and the interventions; each run as a
(DebateConfig, protocol) pair.

Every method runs through the same `DebateEngine`, the same questions, model and seeds. Round 0 is generated
once per question (``max(V, self-consistency samples)`` independent answers, stored in
``traces/<benchmark>/round0.jsonl`` by eval.run) and every method starts from it
(`DebateEngine.start_from_round0`):

- single CoT = agent 0's stored round-0 answer (1 agent, no exchange);
- round-0 majority = the plurality of the stored round 0's first V answers (no exchange);
- self-consistency with n samples = the plurality of the first n stored answers;
- adaptive self-consistency (`adaptive-sc-A`) = the first V stored answers, then one more at a time until A share
  an answer (at most n), the plurality over those used (`dear.debate.sampling_rules`; no new generation);
- MAD, MAD stopped at unanimity, DEAR and every ablation continue the first V stored answers;
- "DEAR no-selection + no-behavior" would be MAD exactly (full mask, fixed sampling).

Token accounting ignores the sharing: every method is charged all the tokens of all its calls (its round-0
calls included), as if run alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from dear.debate import DebateConfig
from dear.debate.engine import Debate, DebateEngine
from dear.debate.interventions import InterventionConfig, InterventionProtocol
from dear.debate.methods import DEFAULT_METHODS, METHODS, MethodSpec
from dear.debate.protocols import MajorityProtocol, Protocol
from dear.debate.sampling_rules import FittedParams, RuleParams, Samples, samples_needed, samples_used
from dear.debate.trace import AgentTurn
from dear.llm.base import Backend
from dear.llm.registry import is_synthetic
from dear.tasks.types import Question
from dear.policy import JointPolicy, PolicyConfig
from eval.action_frequencies import ActionFrequencies

log = logging.getLogger(__name__)


def round0_width(methods: Sequence[str], n_agents: int, sc_samples: int) -> int:
    """Answers the stored round 0 must hold for these methods: V, or the self-consistency samples when a method
    reads them (`sc`, and the adaptive rules, which may read all of them)."""
    wide = any(m == "sc" or (m in METHODS and METHODS[m].rule) for m in methods)
    return max(n_agents, sc_samples if wide else 0)


def check_adaptive(specs: Sequence[MethodSpec], n_agents: int, sc_samples: int) -> None:
    """A rule over the stored samples must be able to reach its agreement (or its first window) within
    --sc-samples."""
    for spec in specs:
        if spec.rule and sc_samples < samples_needed(spec.rule, n_agents):
            raise ValueError(f"method {spec.name!r} ({spec.description}) needs --sc-samples >= "
                             f"{samples_needed(spec.rule, n_agents)}, got {sc_samples}")


def rule_width(spec: MethodSpec, round0: Sequence[AgentTurn], n_agents: int, sc_samples: int,
               params: RuleParams) -> int:
    """How many of one question's stored round-0 answers a rule method reads: its rule over the first
    `sc_samples`, starting from the first V (`params`: a confidence rule's fitted parameters)."""
    samples = Samples.of_turns(round0[:sc_samples])
    if spec.reads_confidence and samples.confidence is None:
        raise ValueError(f"method {spec.name!r} reads the samples' confidences; this stored round 0 has none (it was "
                         "generated without log-probabilities): run it in a new --out directory")
    return samples_used(samples, spec.rule, start=n_agents, params=params)


def parse_methods(text: str) -> list[MethodSpec]:
    """Comma-separated method names (or `all`) -> specs, with a clear error for unknown names."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        names = list(DEFAULT_METHODS)
    if not names:
        raise ValueError("--methods is empty; known methods: " + ", ".join(METHODS))
    unknown = [n for n in names if n not in METHODS and "+" not in n]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known methods: {', '.join(METHODS)} "
                         f"(and <method>+<intervention>..., e.g. mad+judge+policy; see eval/interventions.py)")
    if len(set(names)) != len(names):
        raise ValueError(f"--methods lists a method twice: {names}")
    return [METHODS[n] if n in METHODS else intervention_spec(n) for n in names]


# ---------------------------------------------------------------- checkpoints
@dataclass
class Checkpoint:
    """A trained joint policy, from an exported artifact or a training run directory."""

    path: Path
    policy_config: PolicyConfig
    state_dict: dict[str, torch.Tensor]
    encoder: str  # encoder spec the policy was trained with
    n_rounds: int | None = None  # exchange rounds it was trained for (None = unknown)
    trained_on: str = ""  # backend / task it was trained with, for the report
    synthetic: bool = False  # trained on the sim backend
    world: str = "unknown-trained"  # the training world, in every DEAR label: "sim-trained", "sim-fitted", ...
    sha256: str = ""  # of the weights file the policy was loaded from (the settings guard compares it)
    answer_aware: float = 0.0  # the evidence it was trained on (0: the paper's e_ij)
    silent: bool = False  # trained with silent turns (an agent that reads nobody makes no call)
    decision: str = "last-round"  # the final vote it was trained with (dear.debate.engine.DECISIONS)
    vote_tau: float = DebateConfig.vote_tau  # ... and a confidence-weighted vote's softmax temperature

    @property
    def reads_confidence(self) -> bool:
        """Its debates need the samples' log-probabilities: it observes confidence or its vote weighs by it."""
        return bool(self.policy_config.confidence_feature) or self.decision == "confidence-weighted"

    def label(self, spec: MethodSpec) -> str:
        """A DEAR method's label with the policy's training world, e.g. "DEAR (sim-trained)"."""
        return f"{spec.label} ({self.world})"

    @property
    def extended(self) -> bool:
        """Whether the policy plays the extended action set (turn kinds and a stop)."""
        return self.policy_config.actions == "extended"

    def policy(self, spec: MethodSpec | None = None, seed: int = 0) -> JointPolicy:
        """The policy, with the method's ablation switches applied to the same weights (the random control of an
        extended policy also draws its kinds and stop at random)."""
        cfg = self.policy_config
        if spec is not None:
            cfg = replace(cfg, selection_mode=spec.selection_mode, behavior_mode=spec.behavior_mode,
                          fusion=spec.fusion, seed=seed)
            if spec.selection_mode == "random" and self.extended:
                cfg = replace(cfg, kinds_mode="random", stop_mode="random")
        pol = JointPolicy(cfg)
        try:
            pol.load_state_dict(self.state_dict)
        except RuntimeError as e:
            raise ValueError(
                f"checkpoint {self.path}: weights do not fit a policy with n_agents={cfg.n_agents} "
                f"(is the manifest's V right?): {e}"
            ) from None
        pol.eval()
        return pol


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Load an exported policy (`dear.export`: manifest.json + policy.safetensors), a training run directory
    (its latest checkpoint) or one checkpoint directory (`RUN_DIR/checkpoints/iter_XXXXXX`).

    Trainer checkpoints go through `dear.export.export_checkpoint` (into a temporary directory), so both
    paths read V, action ranges, fusion and encoder the same way and get the same consistency checks."""
    import tempfile

    from dear.export import MANIFEST_FILE, ExportError, export_checkpoint, load_exported

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--checkpoint {path}: no such file or directory")
    if path.is_dir() and (path / "checkpoints").is_dir() and not (path / "checkpoints" / "latest").exists():
        raise FileNotFoundError(f"--checkpoint {path}: run directory has no finished checkpoint "
                                f"({path / 'checkpoints' / 'latest'} missing)")
    try:
        if (path / MANIFEST_FILE).exists():
            exported = load_exported(path)
        else:
            with tempfile.TemporaryDirectory(prefix="dear-eval-ckpt-") as tmp:
                exported = load_exported(export_checkpoint(path, tmp))
    except (ExportError, KeyError, OSError) as e:
        raise ValueError(f"--checkpoint {path}: not a usable DEAR policy: {e}") from None
    except RuntimeError as e:  # load_state_dict: tensor shapes do not fit the config's V / hidden sizes
        raise ValueError(f"--checkpoint {path}: weights do not fit a policy with n_agents="
                         f"{_config_agents(path)} (is the config's V right?): {e}") from None
    m = exported.manifest
    training = dict(m.get("training", {}))
    cfg = exported.policy.config
    for field_, mode in (("selection_mode", cfg.selection_mode), ("behavior_mode", cfg.behavior_mode)):
        if mode != "learned":
            log.warning("checkpoint %s was trained with %s=%s: that actor is untrained in the 'dear' method",
                        path, field_, mode)
    return Checkpoint(
        path=path, policy_config=cfg,
        state_dict={k: v.detach().clone() for k, v in exported.policy.state_dict().items()},
        encoder=exported.encoder, n_rounds=exported.n_rounds,
        trained_on=f"{training.get('llm') or 'unknown backend'} on {training.get('task') or 'unknown task'}"
                   + (f" (iteration {training['iteration']})" if training.get("iteration") is not None else ""),
        synthetic=exported.synthetic, world=training_world(training), sha256=_weights_sha256(path),
        answer_aware=exported.answer_aware, silent=exported.silent, decision=exported.decision,
        vote_tau=exported.vote_tau,
    )


def training_world(training: dict[str, Any]) -> str:
    """The world a policy was trained in, from its manifest's ``training`` block: an explicit ``world``, else
    ``sim-fitted`` (sim backend with a parameter file), ``sim-trained`` (sim backend, hand-set or default
    parameters) or ``<llm>-trained`` for a real backend."""
    if training.get("world"):
        return str(training["world"])
    llm = str(training.get("llm") or "unknown")
    if is_synthetic(llm):  # an old sim spec named its parameter file after a colon (sim:PATH)
        return "sim-fitted" if isinstance(training.get("sim_params"), str) or ":" in llm else "sim-trained"
    return f"{llm}-trained"


def _trainer_dir(path: Path) -> Path | None:
    """The checkpoint directory of a trainer run / checkpoint path (None for an exported policy)."""
    if (path / "model.safetensors").exists():
        return path
    latest = path / "checkpoints" / "latest"
    if latest.exists():
        return path / "checkpoints" / latest.read_text().strip()
    return None


def _weights_sha256(path: Path) -> str:
    import hashlib

    from dear.export import WEIGHTS_FILE

    ckpt = _trainer_dir(path)
    weights = ckpt / "model.safetensors" if ckpt is not None else path / WEIGHTS_FILE
    h = hashlib.sha256()
    with weights.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _config_agents(path: Path) -> str:
    """V named by a trainer checkpoint's config.yaml (for the error message only)."""
    import yaml

    for cand in [path, *(path / "checkpoints").glob("iter_*")] if path.is_dir() else []:
        if (cand / "config.yaml").exists():
            try:
                env = yaml.safe_load((cand / "config.yaml").read_text())["env"]
                return str(env["n_agents"] if "n_agents" in env else env["num_agents"])  # old runs: num_agents
            except (KeyError, TypeError, yaml.YAMLError):
                break
    return "?"


def check_compatible(ckpt: Checkpoint, n_agents: int | None, temperature_range: tuple[float, float] | None,
                     top_p_range: tuple[float, float] | None) -> None:
    """Refuse to run a policy on a debate shape or action ranges it was not trained for."""
    cfg = ckpt.policy_config
    if n_agents is not None and n_agents != cfg.n_agents:
        raise ValueError(
            f"checkpoint {ckpt.path} was trained for V={cfg.n_agents} agents but --n-agents={n_agents}; "
            f"the selection/behavior networks' sizes depend on V"
        )
    for name, what, want, have in (("--temperature-range", "temperature range", temperature_range, cfg.temperature_range),
                                   ("--top-p-range", "top-p range", top_p_range, cfg.top_p_range)):
        if want is not None and tuple(float(x) for x in want) != tuple(float(x) for x in have):
            raise ValueError(
                f"checkpoint {ckpt.path} maps actions to the {what} {list(have)} "
                f"but {name}={list(want)} was given; a policy only makes sense in the ranges it was trained on"
            )


# ---------------------------------------------------------------- building a method's run
@dataclass
class MethodRun:
    config: DebateConfig
    protocol: Any  # Protocol, RegulatedProtocol or DensityMatched


@dataclass
class DensityMatched:
    """The random-mask control: before exchange round r, every pair is read with probability density[r-1]
    (DEAR's realized read density of round r on the same benchmark); behavior stays the policy's. With
    `frequencies` (an extended-action policy), the debate stops, each agent's kind is drawn, and a reviser's pairs
    are read, at DEAR's realized frequencies of that round instead (eval/action_frequencies.py)."""

    inner: Any  # a RegulatedProtocol whose policy has selection_mode="random" (extended: kinds and stop too)
    density: list[float]  # per exchange round 1..R
    frequencies: ActionFrequencies | None = None

    def __post_init__(self):
        if len(self.density) < self.inner.n_rounds:
            raise ValueError(f"density-matched random mask: {len(self.density)} round densities for "
                             f"{self.inner.n_rounds} exchange rounds")
        if not all(0.0 <= p <= 1.0 for p in self.density):
            raise ValueError(f"density-matched random mask: densities must be in [0, 1], got {self.density}")
        if self.frequencies is not None and len(self.frequencies.stop) < self.inner.n_rounds:
            raise ValueError(f"frequency-matched random policy: {len(self.frequencies.stop)} rounds of frequencies "
                             f"for {self.inner.n_rounds} exchange rounds")

    @property
    def n_rounds(self) -> int:
        return self.inner.n_rounds

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def records(self) -> dict:
        return self.inner.records

    def controls(self, debates):
        rounds = {d.round for d in debates}
        if len(rounds) != 1:
            raise ValueError(f"density-matched random mask: debates at different rounds {sorted(rounds)}")
        r = rounds.pop()  # debates that ran round r choose round r + 1: the lists' entry r
        config = self.inner.policy.config
        config.random_p = float(self.density[r])  # an extended policy's: its revisers' density (eval.run)
        if self.frequencies is not None:
            config.random_kinds = tuple(self.frequencies.kinds[r])
            config.random_stop = float(self.frequencies.stop[r])
        return self.inner.controls(debates)


def vote_rule(spec: MethodSpec, ckpt: Checkpoint | None = None, base: str = DebateConfig.decision) -> str:
    """The rule a method's final votes are taken by (dear.debate.engine.DECISIONS), as `build` sets it: a DEAR
    method's is its checkpoint's (the rule the policy was trained with), every other method's the base config's
    (`base`: the paper's last round; MAD-stop's vote at unanimity is a last round's too), a confidence rule's the
    confidence-weighted vote. eval.run records it in run.json."""
    if spec.reads_confidence:
        return "confidence-weighted"
    return ckpt.decision if spec.needs_checkpoint and ckpt is not None else base


def build(spec: MethodSpec, base: DebateConfig, sc_samples: int, ckpt: Checkpoint | None = None,
          encoder=None, seed: int = 0, deterministic: bool = True,
          density: list[float] | None = None, frequencies: ActionFrequencies | None = None,
          fitted: FittedParams | None = None) -> MethodRun:
    """The DebateConfig and protocol that run `spec` (DEAR kinds need the checkpoint and its encoder; the
    random-mask control needs DEAR's per-round read density; the confidence rules their fitted parameters).
    ``deterministic``: the policy's mode (pairs with p > 0.5, behavior mean) instead of sampled actions."""
    if "+" in spec.name:  # a debate method with interventions (below)
        return build_intervention_method(spec.name, base, sc_samples, ckpt, encoder, seed=seed,
                                         deterministic=deterministic)
    if spec.kind == "samples":  # over the stored round 0: an adaptive rule reads up to sc_samples (rule_width)
        n = sc_samples if spec.name == "sc" or spec.rule else base.n_agents
        proto: Protocol = MajorityProtocol()
        proto.name = spec.name
        config = replace(base, n_agents=n, n_rounds=0)
        if spec.reads_confidence:  # the vote weighs the samples by confidence
            if fitted is None:
                raise ValueError(f"method {spec.name!r} needs fitted rule parameters (eval.run --rule-params)")
            config = replace(config, decision="confidence-weighted", vote_tau=fitted.of(spec.rule).tau)
        return MethodRun(config, proto)
    if spec.kind in ("single", "debate"):  # the catalog's protocol, continuing the stored round 0
        return MethodRun(*spec.make(base, sc_samples, fitted))
    if ckpt is None or encoder is None:
        raise ValueError(f"method {spec.name!r} needs --checkpoint")
    from dear.regulator import RegulatedProtocol  # floor 3

    # The policy runs in the debates it was trained in: silent turns, and the final vote (an extended policy's
    # stop reads the vote's features, so they must be the rule's) as dear.infer runs them.
    base = replace(base, silent=ckpt.silent, decision=ckpt.decision, vote_tau=ckpt.vote_tau)
    proto_r = RegulatedProtocol(policy=ckpt.policy(spec, seed=seed), encoder=encoder, config=base,
                                deterministic=deterministic, name=spec.name, answer_aware=ckpt.answer_aware)
    if spec.selection_mode == "random":
        if density is None:
            raise ValueError(f"method {spec.name!r} needs DEAR's per-round read density")
        return MethodRun(base, DensityMatched(proto_r, list(density), frequencies))
    return MethodRun(base, proto_r)


# ---------------------------------------------------------------- interventions (`<base>+<intervention>...`)
INTERVENTIONS = ("judge", "policy", "regenerate", "moderator", "moderator-noagenda")
EXAMPLES = ("mad+judge+policy", "mad+judge+regenerate", "mad+moderator", "dear+judge+policy")
_LABELS = {"judge": "DRIFTJudge", "policy": "DRIFTPolicy", "regenerate": "Regenerate",
           "moderator": "moderator + agenda", "moderator-noagenda": "moderator"}


def is_intervention_method(name: str) -> bool:
    return "+" in name


def debate_methods() -> list[str]:
    """The methods an intervention can wrap: those that debate (MAD and DEAR with their variants)."""
    return [n for n, s in METHODS.items() if s.kind in ("debate", "dear")]


def methods_help() -> str:
    """Every method name `--methods` accepts, as `--help` shows them."""
    return (f"comma-separated, or all: {','.join(METHODS)}; or a debate method ({','.join(debate_methods())}) "
            f"with interventions, <method>+<intervention>[+...], interventions {','.join(INTERVENTIONS)} "
            f"(e.g. {', '.join(EXAMPLES)})")


def parse_intervention_method(name: str, **overrides: Any) -> tuple[MethodSpec, InterventionConfig]:
    """`mad+judge+policy` -> (the base method's spec, the intervention config). `overrides` set other
    InterventionConfig fields (thresholds, token limits). Unknown parts get an error naming them."""
    base, parts = base_method(name), [p.strip() for p in name.split("+")[1:]]
    if not parts or not all(parts):
        raise ValueError(f"method {name!r}: expected <base>+<intervention>[+...], e.g. {', '.join(EXAMPLES)}")
    spec = METHODS.get(base)
    if spec is None or spec.kind not in ("debate", "dear"):
        raise ValueError(f"method {name!r}: base {base!r} is not a debate method; interventions wrap one of "
                         f"{', '.join(debate_methods())}")
    unknown = [p for p in parts if p not in INTERVENTIONS]
    if unknown:
        raise ValueError(f"method {name!r}: unknown intervention(s) {unknown}; known: {', '.join(INTERVENTIONS)}")
    if len(set(parts)) != len(parts) or ("moderator" in parts and "moderator-noagenda" in parts):
        raise ValueError(f"method {name!r} names an intervention twice")
    if ("policy" in parts or "regenerate" in parts) and "judge" not in parts:
        raise ValueError(f"method {name!r}: policy and regenerate act on the judge's verdicts; write "
                         f"{base}+judge+{'policy' if 'policy' in parts else 'regenerate'}")
    moderator = "moderator" in parts or "moderator-noagenda" in parts
    try:
        cfg = InterventionConfig(judge="judge" in parts, policy="policy" in parts,
                                 regenerate="regenerate" in parts, moderator=moderator,
                                 agenda="moderator" in parts, **overrides)
    except TypeError as e:
        raise ValueError(f"method {name!r}: bad intervention option: {e}") from None
    except ValueError as e:
        raise ValueError(f"method {name!r}: {e}") from None
    return spec, cfg


def intervention_spec(name: str) -> MethodSpec:
    """The MethodSpec of an intervention method (kind and ablation switches of its base)."""
    base, cfg = parse_intervention_method(name)
    added = " + ".join(_LABELS[p] for p in name.split("+")[1:])
    return replace(base, name=name, label=f"{base.label} + {added}",
                   description=f"{base.description}; with {added} ({cfg.label()})")


def build_intervention_method(name: str, base: DebateConfig, sc_samples: int = 0, ckpt: Checkpoint | None = None,
                              encoder=None, seed: int = 0, backend: Backend | None = None,
                              deterministic: bool = True, **overrides: Any) -> MethodRun:
    """The DebateConfig and InterventionProtocol that run `name` (DEAR bases need the checkpoint and encoder).
    `backend` serves the judge / feedback / moderator calls (None = the debaters' backend)."""
    base_spec, cfg = parse_intervention_method(name, **overrides)
    inner = build(base_spec, base, sc_samples, ckpt, encoder, seed=seed,  # the base method, then wrapped
                    deterministic=deterministic)
    return MethodRun(inner.config, InterventionProtocol(inner.protocol, cfg, backend=backend, name=name))


def run_method(run: MethodRun, engine: DebateEngine, questions: Sequence[Question]) -> list[Debate]:
    """Run a method's debates: intervention methods drive the engine themselves, the others go through it."""
    if isinstance(run.protocol, InterventionProtocol):
        return run.protocol.run(engine, questions)
    return engine.run(questions, run.protocol)


def base_method(method: str) -> str:
    """The debate method an intervention method wraps (`mad+judge+policy` -> `mad`); a plain method is its own."""
    return method.split("+")[0].strip()
