"""The DEAR regulator: a finished round -> the next round's RoundControl for each debate (floor 3).

    texts --encoder--> h_i, c_i --pairwise_evidence--> e_ij --opinions--> (b, u)
          --SelectionPolicy--> mask --fuse--> behavior obs --BehaviorPolicy--> (T_i, top-p_i)

The environment, the evaluation and the inference API all go through `observe` and `RegulatedProtocol`,
so a trained policy sees exactly the features it was trained on.

Centralised-critic state (`state_dim(V) = V*V + 2V + 4`, every entry in [0, 1], no gold information):

    [ b.flatten() (V*V) | u (V) | round / n_rounds | plurality share | distinct answers / V |
      no-answer share | agrees-with-plurality per agent (V) ]

"plurality share" = agents holding the most common parsed answer / V (0 when nobody parsed an answer).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dear.belief import opinions
from dear.confidence import record_of
from dear.debate.engine import Debate, DebateConfig, RoundControl
from dear.debate.trace import AgentTurn
from dear.evidence import Encoder, answer_aware_evidence, pairwise_evidence
from dear.debate.profiles import in_vocabulary
from dear.policy import JointPolicy, observes_decision, profile_onehot, selection_observation
from dear.vote import tally

_EMPTY_TEXT = "(empty)"  # stands in for a blank section so the encoder always gets text


def state_dim(n_agents: int) -> int:
    """Length of the centralised-critic state vector for V agents."""
    return n_agents * n_agents + 2 * n_agents + 4


@dataclass
class BeliefObservation:
    """Beliefs and observations of B debates after their last completed round (float32 torch tensors)."""

    evidence: torch.Tensor  # (B, V, V) e_ij (diagonal 1)
    b: torch.Tensor  # (B, V, V) belief masses, b_ii = 0
    u: torch.Tensor  # (B, V) uncertainties
    selection_obs: torch.Tensor  # (B, V(2V+1))
    state: torch.Tensor  # (B, state_dim(V))
    round: list[int]  # last completed round per debate
    decision: torch.Tensor | None = None  # (B, 3) `decision_features`
    profiles: torch.Tensor | None = None  # (B, V x P) the agents' profile one-hots (`profile_features`), if asked
    confidence: torch.Tensor | None = None  # (B, V) each agent's confidence in its answer (`confidence_features`)

    @property
    def batch_size(self) -> int:
        return int(self.b.shape[0])

    def selection_input(self, actions: str = "paper", decision_features: bool = False) -> torch.Tensor:
        """The selection policy's input: the paper's observation, then the profile one-hots if observed (the
        profile feature), then (`dear.policy.observes_decision`: the extended action set, whose stop needs them,
        or when asked) the decision features (the round, and how decided the vote would be if it stopped now)."""
        parts = [self.selection_obs] + [x for x in (self.profiles, self.confidence) if x is not None]
        if observes_decision(actions, decision_features):
            if self.decision is None:
                raise ValueError("selection_input: this observation has no decision features")
            parts.append(self.decision)
        return torch.cat(parts, dim=-1) if len(parts) > 1 else self.selection_obs


def _answer_features(keys: Sequence[str | None]) -> tuple[float, float, float, list[float]]:
    """(plurality share, distinct share, no-answer share, agrees-with-plurality per agent) of answer keys."""
    n = len(keys)
    t = tally(keys)  # ties: every tied answer counts as plurality
    agrees = [1.0 if k is not None and k in t.leaders else 0.0 for k in keys]
    return t.top / n, len(t.counts) / n, sum(k is None for k in keys) / n, agrees


def decision_features(d: Debate) -> list[float]:
    """[round / R, leader's votes / V, (leader − runner-up votes) / V], capped at 1, over the answers the debate's
    final vote counts now (`Debate.voters`: the last round, or every sample under the all-answers rule)."""
    v = d.n_agents
    counts = sorted(tally([t.answer_key for t in d.voters(d.decision)]).counts.values(), reverse=True) + [0, 0]
    round_frac = d.round / d.n_rounds if d.n_rounds > 0 else 1.0
    return [min(max(round_frac, 0.0), 1.0), min(counts[0] / v, 1.0), min((counts[0] - counts[1]) / v, 1.0)]


def held_confidence(d: Debate, agent: int) -> float:
    """The agent's confidence in the answer it holds: exp(mean token log-probability) of its latest sent turn (a kept
    turn holds the sample it kept), 0 while it waits, has no answer or its record is missing."""
    for turns in reversed(d.trace.rounds):
        turn = turns[agent]
        if turn.silent and not turn.waiting:
            continue
        record = record_of(turn.confidence) if turn.answer_key is not None else None
        return math.exp(record.mean_logprob) if record is not None else 0.0
    return 0.0


def confidence_features(debates: Sequence[Debate]) -> torch.Tensor:
    """(B, V) `held_confidence` of every agent; ValueError when the sent turns of a debate that did not fail carry no
    confidence at all (the debate did not ask for log-probabilities: DebateConfig.logprobs)."""
    rows = []
    for d in debates:
        sent = [t for turns in d.trace.rounds for t in turns if not t.silent]
        if not d.failed and sent and all(t.confidence is None for t in sent):
            raise ValueError(f"debate {d.debate_id}: the policy's confidence feature needs turns with confidence "
                             f"records (set DebateConfig.logprobs)")
        rows.append([held_confidence(d, i) for i in range(d.n_agents)])
    return torch.tensor(rows, dtype=torch.float32)


def round_evidence(rounds: Sequence[Sequence[AgentTurn]], encoder: Encoder, answer_aware: float = 0.0) -> torch.Tensor:
    """e_ij of each given round's agents, (len(rounds), V, V), from ONE encode call over every agent's reasoning
    and conclusion. `answer_aware` > 0 mixes into e_ij whether the two agents' parsed answers agree
    (dear.evidence.answer_aware_evidence; 0 = the paper's e_ij)."""
    texts: list[str] = []
    for turns in rounds:
        texts += [t.reasoning if t.reasoning.strip() else _EMPTY_TEXT for t in turns]
        texts += [t.conclusion if t.conclusion.strip() else _EMPTY_TEXT for t in turns]
    emb = torch.from_numpy(np.asarray(encoder.encode(texts), dtype=np.float32))
    emb = emb.reshape(len(rounds), 2, len(rounds[0]), -1)
    e = pairwise_evidence(emb[:, 0], emb[:, 1])
    if answer_aware > 0:
        e = answer_aware_evidence(e, [[t.answer_key for t in turns] for turns in rounds], answer_aware)
    return e


def profile_features(debates: Sequence[Debate], vocabulary: Sequence[str]) -> torch.Tensor:
    """(B, V x P) one-hots of each agent's profile in its last turn, by name in `vocabulary` (a name the
    vocabulary lacks is matched without its backend: `local:cot` is `cot`). ValueError for a debate without
    profiles or an unknown profile."""
    names = []
    for d in debates:
        seats = [t.profile for t in d.last_turns]
        if any(name is None for name in seats):
            raise ValueError(f"debate {d.debate_id}: the policy's profile feature needs agent profiles "
                             f"(its vocabulary: {list(vocabulary)}); this debate's agents have none")
        names.append([in_vocabulary(n, vocabulary) for n in seats])
    return profile_onehot(names, vocabulary)


def observe(debates: Sequence[Debate], encoder: Encoder, answer_aware: float = 0.0,
            profile_vocabulary: Sequence[str] | None = None, confidence: bool = False) -> BeliefObservation:
    """Encode every agent's reasoning and conclusion of each debate's last round (ONE encode call) and
    turn them into beliefs, the selection observation and the critic state (`round_evidence`). Each debate's
    certainties 1 - u of that round are kept in `Debate.certainty` (the belief-weighted vote reads them).
    With `profile_vocabulary` (a policy's profile feature) the agents' profile one-hots are observed too, and with
    `confidence` (its confidence feature) each agent's confidence in its answer."""
    if not debates:
        raise ValueError("observe: no debates given")
    n_agents = debates[0].n_agents
    for d in debates:
        if len(d.last_turns) != n_agents:
            raise ValueError(
                f"observe: debate {d.debate_id} has {len(d.last_turns)} turns in its last round, "
                f"expected {n_agents} (has round 0 run?)"
            )
    e = round_evidence([d.last_turns for d in debates], encoder, answer_aware)
    op = opinions(e)
    b, u = op.b.float(), op.u.float()
    for d, u_d in zip(debates, u):
        d.certainty[d.round] = (1.0 - u_d).tolist()

    extra = []
    for d in debates:
        plural, distinct, missing, agrees = _answer_features(d.answer_keys)
        round_frac = d.round / d.n_rounds if d.n_rounds > 0 else 1.0
        extra.append([min(max(round_frac, 0.0), 1.0), plural, distinct, missing, *agrees])
    state = torch.cat([b.reshape(len(debates), -1), u, torch.tensor(extra, dtype=torch.float32)], dim=-1)
    return BeliefObservation(
        evidence=e.float(),
        b=b,
        u=u,
        selection_obs=selection_observation(b, u),
        state=state,
        round=[d.round for d in debates],
        decision=torch.tensor([decision_features(d) for d in debates], dtype=torch.float32),
        profiles=None if profile_vocabulary is None else profile_features(debates, profile_vocabulary),
        confidence=confidence_features(debates) if confidence else None,
    )


@dataclass
class CertaintyWeigher:
    """The belief-weighted vote's weights (dear.debate.engine.Weigher): each agent's certainty 1 - u_i in every
    round of a debate that no observation has covered yet (usually only the last, which the engine votes on
    before the regulator sees it). u_i = V / (V + sum_j e_ij) (docs/DESIGN.md §3), so an answer weighs more the more its
    reasoning is corroborated by its round's peers; 1 - u_i < 1/2."""

    encoder: Encoder
    answer_aware: float = 0.0  # the evidence the regulator uses (observe)

    def __call__(self, debates: Sequence[Debate]) -> None:
        todo: dict[int, list[tuple[Debate, int]]] = {}  # by round width: one batch per V
        for d in debates:
            for r, turns in enumerate(d.trace.rounds):
                if r not in d.certainty:
                    todo.setdefault(len(turns), []).append((d, r))
        for group in todo.values():
            rounds = [d.trace.rounds[r] for d, r in group]
            u = opinions(round_evidence(rounds, self.encoder, self.answer_aware)).u.float()
            for (d, r), u_r in zip(group, u):
                d.certainty[r] = (1.0 - u_r).tolist()


def make_controls(
    mask: np.ndarray | torch.Tensor, temperature: np.ndarray | torch.Tensor, top_p: np.ndarray | torch.Tensor,
    kinds: Sequence[Sequence[str]] | None = None, stop: np.ndarray | torch.Tensor | None = None,
) -> list[RoundControl]:
    """Batched (B, V, V) mask and (B, V) sampling -> one RoundControl per debate; the extended action set also
    gives each agent's turn kind by name and the stop (B,)."""
    mask, temperature, top_p = (
        x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        for x in (mask, temperature, top_p)
    )
    if stop is not None:
        stop = stop.detach().cpu().numpy() if isinstance(stop, torch.Tensor) else np.asarray(stop)
    return [
        RoundControl(
            mask=mask[k].astype(bool),
            temperature=temperature[k].astype(np.float64),
            top_p=top_p[k].astype(np.float64),
            kinds=None if kinds is None else tuple(kinds[k]),
            stop=False if stop is None else bool(stop[k]),
        )
        for k in range(mask.shape[0])
    ]


@dataclass
class RegulatorRecord:
    """What the regulator saw and chose before one exchange round of one debate (for traces)."""

    debate_id: str
    round: int  # the round these controls drive
    b: list[list[float]]
    u: list[float]
    mask: list[list[bool]]
    temperature: list[float]
    top_p: list[float]
    kinds: list[str] | None = None  # extended action set: each agent's turn kind
    stop: bool | None = None  # extended action set: the debate stopped before this round

    def to_dict(self) -> dict:
        """Its fields; the extended action set's only when set (paper-policy records keep their keys)."""
        return {k: v for k, v in self.__dict__.items() if v is not None or k not in ("kinds", "stop")}


def decisions_json(debate_id: str, question_id: str, records: Sequence[RegulatorRecord]) -> str:
    """One line of a `*.regulator.jsonl` file: every decision the regulator made in one debate."""
    return json.dumps({"debate_id": debate_id, "question_id": question_id,
                       "decisions": [r.to_dict() for r in records]})


@dataclass
class RegulatedProtocol:
    """A DEAR-regulated debate protocol for `DebateEngine.run` (anything with `n_rounds` + `controls`).

    ``controls(debates)`` observes the debates' last round, runs the joint policy (deterministic by default:
    pairs with p > 0.5, behavior mean) and returns one RoundControl per debate. Each decision is appended to
    ``records[debate_id]`` so evaluation can write beliefs/masks/sampling next to the trace.
    """

    policy: JointPolicy
    encoder: Encoder
    config: DebateConfig = field(default_factory=DebateConfig)
    deterministic: bool = True
    name: str = "dear"
    answer_aware: float = 0.0  # the evidence the policy was trained on (manifest "answer_aware"; 0 = the paper's)
    records: dict[str, list[RegulatorRecord]] = field(default_factory=dict)

    def __post_init__(self):
        if self.policy.n_agents != self.config.n_agents:
            raise ValueError(
                f"RegulatedProtocol: policy has n_agents={self.policy.n_agents}, "
                f"DebateConfig.n_agents={self.config.n_agents}"
            )
        vocabulary = self.policy.config.profiles
        if vocabulary is not None:  # fail before any call, not after round 0
            pool = self.config.agent_profiles
            if pool is None:
                raise ValueError(f"RegulatedProtocol: the policy observes agent profiles (trained with "
                                 f"{list(vocabulary)}); give the debate agent profiles")
            names = [in_vocabulary(p.name, vocabulary) for p in pool]
            unknown = [n for n in names if n not in vocabulary]
            if unknown:
                raise ValueError(f"RegulatedProtocol: agent profile {unknown[0]!r} is not one the policy knows (its "
                                 f"profile feature was trained with {list(vocabulary)})")
        if self.policy.config.confidence_feature and self.config.logprobs is None:
            raise ValueError("RegulatedProtocol: the policy observes the agents' confidence; the debate must ask for "
                             "log-probabilities (DebateConfig.logprobs)")
        if self.config.start_width is not None and self.policy.config.actions != "extended":
            raise ValueError("RegulatedProtocol: a debate that starts from fewer samples than agents needs a policy "
                             "with the extended actions (fresh turns seat the waiting agents)")

    @property
    def n_rounds(self) -> int:
        return self.config.n_rounds

    def controls(self, debates: Sequence[Debate]) -> list[RoundControl]:
        obs = observe(debates, self.encoder, self.answer_aware, self.policy.config.profiles,
                      self.policy.config.confidence_feature)
        pc = self.policy.config
        act = self.policy.act(obs.selection_input(pc.actions, pc.decision_features), obs.b, obs.u,
                              deterministic=self.deterministic)
        for k, d in enumerate(debates):
            self.records.setdefault(d.debate_id, []).append(
                RegulatorRecord(
                    debate_id=d.debate_id,
                    round=d.round + 1,
                    b=obs.b[k].tolist(),
                    u=obs.u[k].tolist(),
                    mask=act.mask[k].tolist(),
                    temperature=act.temperature[k].tolist(),
                    top_p=act.top_p[k].tolist(),
                    kinds=None if act.kinds is None else list(act.kind_names[k]),
                    stop=None if act.stop is None else bool(act.stop[k]),
                )
            )
        return make_controls(act.mask, act.temperature, act.top_p, act.kind_names, act.stop)
