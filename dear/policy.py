"""The two DEAR actors and the shared critic (docs/DESIGN.md §4-§6).

Floor 2: imports torch and `dear.belief` only. The same code builds the behavior observation for the
environment, the evaluation and the exported policy (`behavior_observation`).

Conventions (also used by the environment and the export manifest):

- Ordered pairs: ``PAIR_ORDER(V) = [(i, j) for i in range(V) for j in range(V) if j != i]``.
  ``pairs[..., k] = 1`` for ``PAIR_ORDER(V)[k] = (i, j)`` means "agent i reads agent j's previous answer";
  ``mask[..., i, j]`` is the same bit in a (V, V) boolean matrix with a False diagonal.
- Selection observation (V(2V+1)): per agent i, ``[b_i (V), u_i, one_hot(i) (V)]`` concatenated in agent
  order (`selection_observation`).
- Behavior observation (per agent, 2V+2): ``[Ê_i (V), û_i, conflict_i, one_hot(i) (V)]`` where
  ``Ê_i = b̂_i · V / û_i`` is the fused evidence of agent i's opinion combined with the peers it reads
  (`behavior_observation`); conflict_i is the Dempster conflict K_i, and 0 under the "mean" fusion ablation.
- Profile feature (optional, `PolicyConfig.profiles`, off = the paper's observations): with a vocabulary of P
  agent-profile names, the selection input gets each agent's one-hot profile (V x P, agent-major) right after
  the paper's V(2V+1) features, and each agent's behavior observation gets its own one-hot (P) at its end
  (`profile_onehot`). With a fixed pool order one_hot(i) already tells agents apart; the feature matters when
  the order varies (shuffled per debate in training, or another order at inference).
- Decision features (3, last in the selection input; the extended actions always, the paper's with
  `PolicyConfig.decision_features`): ``[round / R, leader's votes / V, (leader - runner-up votes) / V]`` over the
  answers the final vote counts (dear.regulator.decision_features).
- Behavior action: raw pre-sigmoid ``z (V, 2)`` = (temperature, top-p) per agent; flattened agent-major to
  ``2V`` values ``[z_0T, z_0P, z_1T, z_1P, ...]`` in the environment's action. `to_sampling` maps it.
- One joint action per RL agent, so ONE probability ratio each: the selection log-prob is the SUM of the
  V(V-1) Bernoulli log-probs, the behavior log-prob is the SUM over the 2 dims and over all V agents.
  This is the same joint ratio HARL uses: its Gaussian keeps per-dimension log-probs and its HAPPO multiplies
  the per-dimension ratios (`action_aggregation: prod`), and prod_k exp(Δ_k) = exp(sum_k Δ_k). Summing
  log-probs first, as here, forms that product in log space.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.distributions import Bernoulli, Independent, Normal

from dear.belief import Opinion, fuse

SelectionMode = Literal["learned", "full", "random"]
BehaviorMap = Literal["sigmoid", "clip"]
BehaviorMode = Literal["learned", "fixed"]
FusionRule = Literal["dst", "mean"]
ActionSet = Literal["paper", "extended"]
KindsMode = Literal["learned", "revise", "keep", "fresh", "fresh-one", "random"]
StopMode = Literal["learned", "never", "agree", "random"]

# Turn kinds of the extended action set, in the order of the kind head's logits (= dear.debate.engine.TURN_KINDS).
KINDS = ("revise", "keep", "fresh")
REVISE, KEEP, FRESH = range(3)
# Decision features the extended selection observation appends (dear.regulator.decision_features):
# [round / R, leader's votes / V, (leader - runner-up votes) / V] over the answers the final vote would count.
N_DECISION_FEATURES = 3
LEADER_FEATURE = -2  # index of "leader's votes / V" in the extended selection observation

RAW_BOUND = 10.0  # finite bound of the environment's raw behavior Box; sigmoid(±10) is within 5e-5 of 0/1
DEFAULT_TEMPERATURE_RANGE = (0.1, 1.2)
DEFAULT_TOP_P_RANGE = (0.5, 1.0)


# ---------------------------------------------------------------------------------------------------
# Layout helpers
# ---------------------------------------------------------------------------------------------------
def pair_order(n_agents: int) -> list[tuple[int, int]]:
    """The fixed ordered-pair order: ``for i in range(V) for j in range(V) if j != i``."""
    if n_agents < 2:
        raise ValueError(f"n_agents must be >= 2, got {n_agents}")
    return [(i, j) for i in range(n_agents) for j in range(n_agents) if j != i]


def n_pairs(n_agents: int) -> int:
    return n_agents * (n_agents - 1)


def observes_decision(actions: ActionSet = "paper", decision_features: bool = False) -> bool:
    """Whether the selection input ends with the decision features: always with the extended actions (their stop
    needs them), with the paper's actions only when asked (`PolicyConfig.decision_features`)."""
    return actions == "extended" or bool(decision_features)


def selection_obs_dim(n_agents: int, actions: ActionSet = "paper", n_profiles: int = 0,
                      decision_features: bool = False, confidence_feature: bool = False) -> int:
    """The paper's V(2V+1) features, then (profile feature) V x P profile one-hots, then (confidence feature) each
    agent's confidence in its answer (V), then (`observes_decision`) the decision features."""
    decision = N_DECISION_FEATURES if observes_decision(actions, decision_features) else 0
    confidence = n_agents if confidence_feature else 0
    return n_agents * (2 * n_agents + 1) + n_agents * n_profiles + confidence + decision


def selection_head_dim(n_agents: int, actions: ActionSet = "paper") -> int:
    """Logits of the selection net: V(V-1) pairs; extended adds 3 kind logits per agent and one stop logit."""
    return n_pairs(n_agents) + (3 * n_agents + 1 if actions == "extended" else 0)


def behavior_obs_dim(n_agents: int, n_profiles: int = 0) -> int:
    """The paper's 2V+2 features per agent, then (profile feature) the agent's profile one-hot (P)."""
    return 2 * n_agents + 2 + n_profiles


def profile_onehot(names: Sequence[Sequence[str]], vocabulary: Sequence[str]) -> torch.Tensor:
    """(B, V x P) one-hots, agent-major: debate b's agent i has profile `names[b][i]`, position in `vocabulary`.
    ValueError naming an unknown profile and the vocabulary (a policy knows only the profiles it trained with)."""
    index = {name: k for k, name in enumerate(vocabulary)}
    rows = []
    for debate in names:
        unknown = [n for n in debate if n not in index]
        if unknown:
            raise ValueError(f"agent profile {unknown[0]!r} is not one the policy knows (its profile feature was "
                             f"trained with {list(vocabulary)})")
        rows.append([index[n] for n in debate])
    ids = torch.tensor(rows, dtype=torch.long).reshape(len(rows), -1)
    return nn.functional.one_hot(ids, len(vocabulary)).reshape(len(rows), -1).float()


def _pair_index(n_agents: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = zip(*pair_order(n_agents))
    return torch.tensor(rows, device=device), torch.tensor(cols, device=device)


def pairs_to_mask(pairs: torch.Tensor, n_agents: int) -> torch.Tensor:
    """(..., V(V-1)) 0/1 pair vector -> (..., V, V) bool mask with a False diagonal."""
    if pairs.shape[-1] != n_pairs(n_agents):
        raise ValueError(f"pairs: last dim must be V(V-1) = {n_pairs(n_agents)}, got {tuple(pairs.shape)}")
    rows, cols = _pair_index(n_agents, pairs.device)
    mask = torch.zeros(*pairs.shape[:-1], n_agents, n_agents, dtype=torch.bool, device=pairs.device)
    mask[..., rows, cols] = pairs > 0.5
    return mask


def mask_to_pairs(mask: torch.Tensor) -> torch.Tensor:
    """(..., V, V) mask -> (..., V(V-1)) float 0/1 pair vector (diagonal dropped)."""
    n_agents = mask.shape[-1]
    if mask.shape[-2] != n_agents:
        raise ValueError(f"mask: last two dims must be (V, V), got {tuple(mask.shape)}")
    rows, cols = _pair_index(n_agents, mask.device)
    return mask[..., rows, cols].to(torch.float32)


def selection_observation(b: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Selection observation (B, V(2V+1)) from beliefs b (B, V, V) and uncertainties u (B, V)."""
    batch, n_agents = u.shape
    eye = torch.eye(n_agents, dtype=b.dtype, device=b.device).expand(batch, n_agents, n_agents)
    per_agent = torch.cat([b, u.unsqueeze(-1), eye], dim=-1)  # (B, V, 2V+1)
    return per_agent.reshape(batch, -1)


def behavior_observation(
    b: torch.Tensor, u: torch.Tensor, mask: torch.Tensor, rule: FusionRule = "dst"
) -> torch.Tensor:
    """Behavior observation (B, V, 2V+2): fuse each agent's opinion with the peers it reads.

    Uses `dear.belief.fuse`, so env, eval and the exported policy compute the same features:
    ``[Ê_i (V), û_i, conflict_i, one_hot(i) (V)]`` with ``Ê_i = b̂_i · V / û_i`` (Fused.evidence).
    """
    fused = fuse(Opinion(b=b, u=u), mask.to(torch.bool), rule=rule)
    batch, n_agents = u.shape
    eye = torch.eye(n_agents, dtype=b.dtype, device=b.device).expand(batch, n_agents, n_agents)
    evidence = fused.evidence.to(b.dtype)
    # Ê can be large when û is tiny; it stays finite (fuse guarantees û > 0), log-scaling is the net's job.
    return torch.cat(
        [evidence, fused.u.unsqueeze(-1).to(b.dtype), fused.conflict.unsqueeze(-1).to(b.dtype), eye], -1
    )


@dataclass(frozen=True)
class Sampling:
    """Per-agent sampling parameters mapped from raw behavior values (same array type as the input)."""

    temperature: torch.Tensor | np.ndarray
    top_p: torch.Tensor | np.ndarray


def _unit(raw: torch.Tensor | np.ndarray, behavior_map: BehaviorMap) -> torch.Tensor | np.ndarray:
    """Raw values -> [0, 1]: the logistic (docs/DESIGN.md §5), or the affine map of [-1, 1] clipped at its ends."""
    if behavior_map == "clip":
        if isinstance(raw, torch.Tensor):
            return ((raw + 1.0) / 2.0).clamp(0.0, 1.0)
        return np.clip((np.asarray(raw, dtype=np.float64) + 1.0) / 2.0, 0.0, 1.0)
    if behavior_map != "sigmoid":
        raise ValueError(f"behavior_map must be sigmoid|clip, got {behavior_map!r}")
    if isinstance(raw, torch.Tensor):
        return torch.sigmoid(raw)
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(raw, dtype=np.float64)))  # overflow-free logistic


def to_sampling(
    raw: torch.Tensor | np.ndarray,
    temperature_range: tuple[float, float] = DEFAULT_TEMPERATURE_RANGE,
    top_p_range: tuple[float, float] = DEFAULT_TOP_P_RANGE,
    behavior_map: BehaviorMap = "sigmoid",
) -> Sampling:
    """docs/DESIGN.md §5: ``T = T_min + (T_max - T_min) g(z_T)``, ``top_p = P_min + (P_max - P_min) g(z_P)``.

    ``g`` is the logistic σ (the paper's; `behavior_map="sigmoid"`) or ``clip((z + 1) / 2, 0, 1)``
    (`"clip"`): the Gaussian's mean then reaches a range end at a finite raw value, and the policy gradient keeps
    pushing it past the end (as CleanRL clips continuous actions in the environment), where the sigmoid reaches
    it only as z -> ±inf with a vanishing slope. ``raw[..., 0]`` is z_T and ``raw[..., 1]`` is z_P. Works on
    torch tensors and numpy arrays. The only place in the project where this mapping is written down.
    """
    (t_lo, t_hi), (p_lo, p_hi) = temperature_range, top_p_range
    unit = _unit(raw, behavior_map)
    return Sampling(temperature=t_lo + (t_hi - t_lo) * unit[..., 0], top_p=p_lo + (p_hi - p_lo) * unit[..., 1])


def from_sampling(
    temperature: float,
    top_p: float,
    temperature_range: tuple[float, float] = DEFAULT_TEMPERATURE_RANGE,
    top_p_range: tuple[float, float] = DEFAULT_TOP_P_RANGE,
    behavior_map: BehaviorMap = "sigmoid",
) -> tuple[float, float]:
    """Inverse of `to_sampling` for one (T, top-p), clipped to ±RAW_BOUND (so range ends are reachable)."""

    def logit(x: float, lo: float, hi: float, name: str) -> float:
        if not lo <= x <= hi:
            raise ValueError(f"{name}={x} outside its range [{lo}, {hi}]")
        q = (x - lo) / (hi - lo)
        if behavior_map == "clip":
            return 2.0 * q - 1.0
        q = min(max(q, 1e-12), 1 - 1e-12)
        return float(np.clip(math.log(q / (1 - q)), -RAW_BOUND, RAW_BOUND))

    return logit(temperature, *temperature_range, "temperature"), logit(top_p, *top_p_range, "top_p")


# ---------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------
def _layer(inp: int, out: int, std: float = math.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(inp, out)
    nn.init.orthogonal_(layer.weight, std)  # CleanRL/PPO initialisation
    nn.init.zeros_(layer.bias)
    return layer


class RunningNorm(nn.Module):
    """Per-feature running standardisation of network inputs (as CleanRL's NormalizeObservation).

    The DEAR features live on very different scales (b_ij ~ 0.17 +- 0.02, u_i ~ 0.65 +- 0.03, Ê ~ 1 +- 0.6),
    so without it the first layer sees near-constant inputs. A per-sample LayerNorm (HARL's
    `use_feature_normalization`) would not help: it rescales each vector as a whole and leaves a 0.02 spread
    tiny. Statistics are buffers (saved with the weights, broadcast to workers, exported) and are updated
    only by the learner, after an update, with exact float64 parallel Welford (resume stays bit-exact).
    Features with zero variance so far (e.g. a fixed one-hot position) map to 0.
    """

    def __init__(self, dim: int, clip: float = 5.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, self.mean.shape[0]).to(torch.float64)
        if x.shape[0] == 0:
            return
        b_mean, b_var, b_n = x.mean(0), x.var(0, unbiased=False), float(x.shape[0])
        if self.count.item() == 0:
            self.mean.copy_(b_mean)
            self.var.copy_(b_var)
            self.count.fill_(b_n)
            return
        delta = b_mean - self.mean
        total = self.count + b_n
        m2 = self.var * self.count + b_var * b_n + delta.pow(2) * self.count * b_n / total
        self.mean.add_(delta * b_n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.count.item() == 0:  # no statistics yet: identity
            return x
        mean, var = self.mean.to(x.dtype), self.var.to(x.dtype)
        z = (x - mean) * torch.where(var > self.eps, var.clamp_min(self.eps).rsqrt(), torch.zeros_like(var))
        return z.clamp(-self.clip, self.clip)


def _mlp(inp: int, hidden: int, out: int, out_std: float) -> nn.Sequential:
    return nn.Sequential(
        _layer(inp, hidden), nn.Tanh(), _layer(hidden, hidden), nn.Tanh(), _layer(hidden, out, std=out_std)
    )


class SelectionPolicy(nn.Module):
    """Selection actor ("who reads whom"): MLP on the selection observation -> V(V-1) Bernoulli logits; with the
    extended action set also 3 turn-kind logits per agent and one stop logit (`ExtendedSelection`).

    The small output init makes every p_{i<-j} start near sigmoid(bias_init) (0.5 by default), every kind near 1/3
    and the stop near 1/2: the neutral start, favouring no action.
    """

    def __init__(self, n_agents: int, hidden: int = 64, bias_init: float = 0.0, actions: ActionSet = "paper",
                 n_profiles: int = 0, decision_features: bool = False, confidence_feature: bool = False):
        super().__init__()
        self.n_agents = n_agents
        self.actions = actions
        self.obs_dim = selection_obs_dim(n_agents, actions, n_profiles, decision_features, confidence_feature)
        self.n_pairs = n_pairs(n_agents)
        self.obs_norm = RunningNorm(self.obs_dim)
        self.net = _mlp(self.obs_dim, hidden, selection_head_dim(n_agents, actions), out_std=0.01)
        with torch.no_grad():  # every p_{i<-j} starts near sigmoid(bias_init); 0 = 0.5
            self.net[-1].bias[: self.n_pairs].fill_(float(bias_init))
            self.net[-1].bias[self.n_pairs:].zero_()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits (B, selection_head_dim): pairs in `pair_order`, then (extended) V x 3 kinds, then stop."""
        if obs.shape[-1] != self.obs_dim:
            raise ValueError(f"selection obs: expected last dim {self.obs_dim}, got {tuple(obs.shape)}")
        return self.net(self.obs_norm(obs))

    def distribution(self, obs: torch.Tensor) -> Independent:
        """Joint distribution over the pair vector; ``log_prob``/``entropy`` are summed over pairs -> (B,)."""
        return Independent(Bernoulli(logits=self(obs)[..., : self.n_pairs]), 1)

    def extended(self, obs: torch.Tensor) -> ExtendedSelection:
        """The extended action set's distribution (pairs, kinds, stop)."""
        logits = self(obs)
        v, k = self.n_agents, self.n_pairs
        return ExtendedSelection(logits[..., :k], logits[..., k: k + 3 * v].reshape(*logits.shape[:-1], v, 3),
                                 logits[..., -1])


@dataclass
class ExtendedSelection:
    """The extended selection action of one debate and its probabilities, factorised as

        π(stop, kinds, pairs) = Bern(stop) · [no stop] Π_i Cat(kind_i) · Π_{i revises} Π_j Bern(pair_ij)

    Parts that do not act are not part of the action: after a stop nothing else counts, and an agent that keeps
    or draws a fresh sample reads nobody, so its pairs carry no log-prob and no entropy (they would only add
    noise to the gradient). `log_prob` and `entropy` are of that hierarchical action; entropy is exact:
    H(stop) + P(go) Σ_i [H(kind_i) + P(revise_i) Σ_j H(pair_ij)].
    """

    pair_logits: torch.Tensor  # (B, V(V-1))
    kind_logits: torch.Tensor  # (B, V, 3) in KINDS order
    stop_logit: torch.Tensor  # (B,)
    # Parts played by a fixed rule (a baseline setting) carry no log-prob and no entropy.
    learn_pairs: bool = True
    learn_kinds: bool = True
    learn_stop: bool = True

    def _parts(self):
        return (Bernoulli(logits=self.pair_logits), torch.distributions.Categorical(logits=self.kind_logits),
                Bernoulli(logits=self.stop_logit))

    def pair_weights(self, kinds: torch.Tensor) -> torch.Tensor:
        """(B, V(V-1)) 1 where the pair's reader revises (the pairs that act), in pair_order (agent-major)."""
        v = kinds.shape[-1]
        return (kinds == REVISE).to(self.pair_logits.dtype).repeat_interleave(v - 1, dim=-1)

    def sample(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pairs, kinds, stop = (d.sample() for d in self._parts())
        return pairs, kinds, stop

    def mode(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return ((self.pair_logits > 0).to(self.pair_logits.dtype), self.kind_logits.argmax(-1),
                (self.stop_logit > 0).to(self.stop_logit.dtype))

    def log_prob(self, pairs: torch.Tensor, kinds: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
        pair_d, kind_d, stop_d = self._parts()
        go = 1.0 - stop
        inner = (self.learn_kinds * kind_d.log_prob(kinds).sum(-1)
                 + self.learn_pairs * (pair_d.log_prob(pairs) * self.pair_weights(kinds)).sum(-1))
        return self.learn_stop * stop_d.log_prob(stop) + go * inner

    def entropy(self) -> torch.Tensor:
        pair_d, kind_d, stop_d = self._parts()
        v = self.kind_logits.shape[-2]
        p_revise = kind_d.probs[..., REVISE].repeat_interleave(v - 1, dim=-1)
        inner = (self.learn_kinds * kind_d.entropy().sum(-1)
                 + self.learn_pairs * (p_revise * pair_d.entropy()).sum(-1))
        return self.learn_stop * stop_d.entropy() + (1.0 - stop_d.probs) * inner


class BehaviorPolicy(nn.Module):
    """Behavior actor ("how each agent samples"): ONE network shared by all V LLM agents.

    Input per agent: the behavior observation (2V+2, and P with the profile feature). Output: mean of a diagonal
    Gaussian over the 2 raw (pre-sigmoid) values; the log-std is a state-independent learnable parameter (shared by
    agents).
    """

    def __init__(self, n_agents: int, hidden: int = 64, log_std_init: float = -0.5, n_profiles: int = 0):
        super().__init__()
        self.n_agents = n_agents
        self.obs_dim = behavior_obs_dim(n_agents, n_profiles)
        self.obs_norm = RunningNorm(self.obs_dim)
        self.net = _mlp(self.obs_dim, hidden, 2, out_std=0.01)
        self.log_std = nn.Parameter(torch.full((2,), float(log_std_init)))

    def set_mean_bias(self, raw_temperature: float, raw_top_p: float) -> None:
        """Start the mean at given raw values (e.g. the MAD default T=0.7, top-p=0.9)."""
        with torch.no_grad():
            self.net[-1].bias.copy_(torch.tensor([raw_temperature, raw_top_p]))

    @torch.no_grad()
    def bound_log_std_(self, log_std_max: float) -> None:
        """Project the log-std onto (-inf, log_std_max] (in place; gradients are untouched)."""
        self.log_std.clamp_(max=log_std_max)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Mean (B, V, 2) of the raw behavior values."""
        if obs.shape[-1] != self.obs_dim:
            raise ValueError(f"behavior obs: expected last dim {self.obs_dim}, got {tuple(obs.shape)}")
        return self.net(self.obs_norm(obs))

    def distribution(self, obs: torch.Tensor) -> Independent:
        """Joint Gaussian over (V, 2); ``log_prob``/``entropy`` are summed over agents and dims -> (B,)."""
        mean = self(obs)
        std = self.log_std.exp().expand_as(mean)
        return Independent(Normal(mean, std), 2)


class Critic(nn.Module):
    """Centralised critic V_ψ(s) shared by both actors."""

    def __init__(self, state_dim: int, hidden: int = 128):
        super().__init__()
        self.state_dim = state_dim
        self.obs_norm = RunningNorm(state_dim)
        self.net = _mlp(state_dim, hidden, 1, out_std=1.0)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        """Values (B,)."""
        if state.shape[-1] != self.state_dim:
            raise ValueError(f"critic state: expected last dim {self.state_dim}, got {tuple(state.shape)}")
        return self.net(self.obs_norm(state)).squeeze(-1)


# ---------------------------------------------------------------------------------------------------
# Joint actor with baseline slots
# ---------------------------------------------------------------------------------------------------
@dataclass
class PolicyConfig:
    """Everything needed to rebuild a `JointPolicy` (stored in checkpoints / the export manifest)."""

    n_agents: int = 3
    selection_mode: SelectionMode = "learned"  # "full" = no-selection ablation / MAD; "random" = p=0.5
    behavior_mode: BehaviorMode = "learned"  # "fixed" = no-behavior ablation / MAD
    fusion: FusionRule = "dst"  # "mean" = the "Mean" ablation
    selection_hidden: int = 64
    behavior_hidden: int = 64
    log_std_init: float = -0.5
    temperature_range: tuple[float, float] = DEFAULT_TEMPERATURE_RANGE
    top_p_range: tuple[float, float] = DEFAULT_TOP_P_RANGE
    fixed_temperature: float = 0.7  # used by behavior_mode="fixed" and as the learned mean's initial value
    fixed_top_p: float = 0.9
    random_p: float = 0.5  # pair probability of selection_mode="random"
    seed: int = 0  # seeds the "random" selection mode's generator
    behavior_map: BehaviorMap = "sigmoid"  # raw behavior -> sampling (to_sampling); sigmoid = the paper's
    selection_bias_init: float = 0.0  # initial logit of every pair (0: p = 0.5)
    # "paper": pairs + (T, top-p); "extended": also a turn kind per agent (revise / keep / fresh) and a stop
    actions: ActionSet = "paper"
    # extended: learned, or one kind for every agent (baselines: fresh = SC), or fresh-one: agent 0 draws a fresh
    # sample and the others keep (one sample a round: with stop_mode agree, adaptive SC), or random (random_kinds)
    kinds_mode: KindsMode = "learned"
    stop_mode: StopMode = "learned"  # extended: learned, never, agree (stop once the leader has stop_agree), random
    stop_agree: float = 1.0  # stop_mode="agree": stop when the vote's leader holds >= stop_agree * V answers
    # The random controls (eval's frequency-matched random policy sets them per round): each agent's kind drawn
    # with probabilities random_kinds (KINDS order), the debate stopped with probability random_stop.
    random_kinds: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
    random_stop: float = 0.0
    # The profile feature's vocabulary (agent-profile names, `AgentProfile.name`); None = the paper's observations
    profiles: tuple[str, ...] | None = None
    # The paper's actions also observe the decision features (round / R and how decided the vote is); the extended
    # actions always do
    decision_features: bool = False
    # The extended actions' turn kinds the policy may choose (a subset of KINDS; the others get probability 0): a
    # world without a model for revise turns (a sample bank replayed offline) allows keep and fresh only
    turn_kinds: tuple[str, ...] = KINDS
    # Observe each agent's confidence in its current answer (dear.regulator.confidence_features: the geometric-mean
    # token probability exp(mean_logprob) of the sample it holds, 0 while waiting); the debate must ask for logprobs
    confidence_feature: bool = False

    def __post_init__(self):
        if self.selection_mode not in ("learned", "full", "random"):
            raise ValueError(f"selection_mode must be learned|full|random, got {self.selection_mode!r}")
        if self.behavior_mode not in ("learned", "fixed"):
            raise ValueError(f"behavior_mode must be learned|fixed, got {self.behavior_mode!r}")
        if self.behavior_map not in ("sigmoid", "clip"):
            raise ValueError(f"behavior_map must be sigmoid|clip, got {self.behavior_map!r}")
        if self.fusion not in ("dst", "mean"):
            raise ValueError(f"fusion must be dst|mean, got {self.fusion!r}")
        if self.n_agents < 2:
            raise ValueError(f"n_agents must be >= 2, got {self.n_agents}")
        for name, value, allowed in (("actions", self.actions, ("paper", "extended")),
                                     ("kinds_mode", self.kinds_mode, ("learned", *KINDS, "fresh-one", "random")),
                                     ("stop_mode", self.stop_mode, ("learned", "never", "agree", "random"))):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {'|'.join(allowed)}, got {value!r}")
        self.random_kinds = tuple(float(x) for x in self.random_kinds)
        if len(self.random_kinds) != len(KINDS) or min(self.random_kinds) < 0 or abs(sum(self.random_kinds) - 1) > 1e-6:
            raise ValueError(f"random_kinds must be {len(KINDS)} probabilities ({'/'.join(KINDS)}) summing to 1, "
                             f"got {self.random_kinds}")
        if not 0.0 <= self.random_stop <= 1.0:
            raise ValueError(f"random_stop must be in [0, 1], got {self.random_stop}")
        self.temperature_range = tuple(float(x) for x in self.temperature_range)
        self.top_p_range = tuple(float(x) for x in self.top_p_range)
        self.turn_kinds = tuple(str(k) for k in self.turn_kinds)
        if not self.turn_kinds or len(set(self.turn_kinds)) != len(self.turn_kinds) \
                or any(k not in KINDS for k in self.turn_kinds):
            raise ValueError(f"turn_kinds must be distinct kinds of {KINDS} (at least one), got {list(self.turn_kinds)}")
        if self.kinds_mode in KINDS and self.kinds_mode not in self.turn_kinds:
            raise ValueError(f"kinds_mode {self.kinds_mode!r} is not among turn_kinds {list(self.turn_kinds)}")
        if self.profiles is not None:
            self.profiles = tuple(str(x) for x in self.profiles)
            if not self.profiles or len(set(self.profiles)) != len(self.profiles):
                raise ValueError(f"profiles must be distinct profile names (at least one), got {list(self.profiles)}")

    @property
    def n_profiles(self) -> int:
        """P, the profile feature's width (0 without it)."""
        return len(self.profiles) if self.profiles else 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PolicyConfig:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"PolicyConfig: unknown keys {sorted(unknown)}")
        return cls(**data)


@dataclass
class ActOutput:
    """One joint action for a batch of B debates (all tensors on the policy's device, detached)."""

    mask: torch.Tensor  # (B, V, V) bool, mask[b, i, j] = agent i reads agent j
    pairs: torch.Tensor  # (B, V(V-1)) float 0/1 in pair_order
    raw_behavior: torch.Tensor  # (B, V, 2) raw pre-sigmoid sample (log-prob is taken on THIS, unclipped)
    behavior_obs: torch.Tensor  # (B, V, 2V+2) input of the behavior net (store it for PPO)
    temperature: torch.Tensor  # (B, V) mapped from the CLIPPED raw sample (what the env will use)
    top_p: torch.Tensor  # (B, V)
    logp_selection: torch.Tensor  # (B,) summed over pairs; 0 for "full", V(V-1)·log p terms for "random"
    logp_behavior: torch.Tensor  # (B,) summed over agents and the 2 dims; 0 for "fixed"
    entropy_selection: torch.Tensor  # (B,)
    entropy_behavior: torch.Tensor  # (B,)
    # Extended action set only (None for the paper's): turn kind per agent (KINDS index), the stop, and which
    # agents' (T, top-p) act (a kept turn and a stopped debate make no call).
    kinds: torch.Tensor | None = None  # (B, V) long
    stop: torch.Tensor | None = None  # (B,) float 0/1
    behavior_active: torch.Tensor | None = None  # (B, V) float 0/1

    @property
    def kind_names(self) -> list[tuple[str, ...]] | None:
        """Per debate, each agent's turn kind by name (None for the paper's action set)."""
        return None if self.kinds is None else [tuple(KINDS[k] for k in row) for row in self.kinds.tolist()]

    def env_action(self) -> dict[str, np.ndarray]:
        """Batched env action: {"mask": (B, V(V-1)) int8, "behavior": (B, 2V) float32 within ±RAW_BOUND}; the
        extended set adds "kinds" (B, V) int8 (KINDS index) and "stop" (B,) int8."""
        raw = self.raw_behavior.clamp(-RAW_BOUND, RAW_BOUND)
        action = {
            "mask": self.pairs.to(torch.int8).cpu().numpy(),
            "behavior": raw.reshape(raw.shape[0], -1).to(torch.float32).cpu().numpy(),
        }
        if self.kinds is not None:
            action["kinds"] = self.kinds.to(torch.int8).cpu().numpy()
            action["stop"] = self.stop.to(torch.int8).cpu().numpy()
        return action


@dataclass
class EvalOutput:
    """Log-probs and entropies of stored actions under the current parameters (with gradients)."""

    logp_selection: torch.Tensor  # (B,)
    logp_behavior: torch.Tensor  # (B,)
    entropy_selection: torch.Tensor  # (B,)
    entropy_behavior: torch.Tensor  # (B,)


class JointPolicy(nn.Module):
    """Selection -> fusion -> behavior, with fixed baselines in the same slots.

    ``selection_trainable`` / ``behavior_trainable`` tell the trainer which actors to update.
    """

    def __init__(self, config: PolicyConfig | None = None, **kwargs):
        super().__init__()
        if config is None:
            config = PolicyConfig(**kwargs)
        elif kwargs:
            raise ValueError("JointPolicy: pass either a PolicyConfig or keyword arguments, not both")
        self.config = config
        self.n_agents = config.n_agents
        self.selection = SelectionPolicy(config.n_agents, config.selection_hidden, config.selection_bias_init,
                                         config.actions, config.n_profiles, config.decision_features,
                                         config.confidence_feature)
        self.behavior = BehaviorPolicy(config.n_agents, config.behavior_hidden, config.log_std_init,
                                       config.n_profiles)
        self._fixed_raw = from_sampling(
            config.fixed_temperature, config.fixed_top_p, config.temperature_range, config.top_p_range,
            config.behavior_map,
        )
        self.behavior.set_mean_bias(*self._fixed_raw)
        self._generator = torch.Generator().manual_seed(config.seed)

    @property
    def extended(self) -> bool:
        return self.config.actions == "extended"

    @property
    def selection_trainable(self) -> bool:
        c = self.config
        return c.selection_mode == "learned" or (self.extended and "learned" in (c.kinds_mode, c.stop_mode))

    @property
    def behavior_trainable(self) -> bool:
        return self.config.behavior_mode == "learned"

    def reseed(self, seed: int) -> None:
        """Reset the generator of the "random" selection mode."""
        self._generator.manual_seed(seed)

    # -- selection ---------------------------------------------------------------------------------
    def _select(self, selection_obs: torch.Tensor, deterministic: bool):
        batch = selection_obs.shape[0]
        k = n_pairs(self.n_agents)
        zeros = selection_obs.new_zeros(batch)
        mode = self.config.selection_mode
        if mode == "full":
            return selection_obs.new_ones(batch, k), zeros, zeros
        if mode == "random":
            p = self.config.random_p
            draws = torch.rand(batch, k, generator=self._generator).to(selection_obs.device)
            pairs = (draws < p).to(selection_obs.dtype)
            dist = Independent(Bernoulli(probs=selection_obs.new_full((batch, k), p)), 1)
            return pairs, dist.log_prob(pairs), dist.entropy()
        dist = self.selection.distribution(selection_obs)
        pairs = (dist.base_dist.logits > 0).to(selection_obs.dtype) if deterministic else dist.sample()
        return pairs, dist.log_prob(pairs), dist.entropy()

    def _extended_dist(self, selection_obs: torch.Tensor) -> ExtendedSelection:
        c = self.config
        dist = self.selection.extended(selection_obs)
        if len(c.turn_kinds) < len(KINDS):  # kinds the world cannot play get probability 0 (a finite floor: no NaN)
            barred = torch.tensor([k not in c.turn_kinds for k in KINDS], device=dist.kind_logits.device)
            dist.kind_logits = dist.kind_logits.masked_fill(barred, -1e9)
        dist.learn_pairs = c.selection_mode == "learned"
        dist.learn_kinds = c.kinds_mode == "learned"
        dist.learn_stop = c.stop_mode == "learned"
        return dist

    def _select_extended(self, selection_obs: torch.Tensor, deterministic: bool):
        """(pairs that act, kinds, stop, logp, entropy): learned parts from the policy, fixed ones from their rule."""
        c = self.config
        dist = self._extended_dist(selection_obs)
        pairs, kinds, stop = dist.mode() if deterministic else dist.sample()
        if c.selection_mode != "learned":
            pairs = self._select(selection_obs, deterministic)[0]
        if c.kinds_mode == "fresh-one":  # one new sample a round (which agent draws it does not change it)
            kinds = torch.full_like(kinds, KINDS.index("keep"))
            kinds[:, 0] = KINDS.index("fresh")
        elif c.kinds_mode == "random":
            probs = torch.tensor(c.random_kinds).expand(kinds.numel(), len(KINDS))
            kinds = torch.multinomial(probs, 1, generator=self._generator).view_as(kinds).to(kinds.device)
        elif c.kinds_mode != "learned":
            kinds = torch.full_like(kinds, KINDS.index(c.kinds_mode))
        if c.stop_mode == "never":
            stop = torch.zeros_like(stop)
        elif c.stop_mode == "agree":  # the leader's votes / V is a selection feature; 1e-6 absorbs rounding
            stop = (selection_obs[:, LEADER_FEATURE] >= c.stop_agree - 1e-6).to(stop.dtype)
        elif c.stop_mode == "random":
            stop = (torch.rand(stop.shape, generator=self._generator) < c.random_stop).to(stop)
        pairs = pairs * dist.pair_weights(kinds) * (1.0 - stop).unsqueeze(-1)  # only the pairs that act
        return pairs, kinds, stop, dist.log_prob(pairs, kinds, stop), dist.entropy()

    def evaluate_selection(self, selection_obs: torch.Tensor, pairs: torch.Tensor,
                           kinds: torch.Tensor | None = None, stop: torch.Tensor | None = None):
        """(logp (B,), entropy (B,)) of stored selection actions (pairs; extended: also kinds and stop);
        zeros for non-learned modes."""
        if self.extended:
            if kinds is None or stop is None:
                raise ValueError("evaluate_selection: the extended action set needs the stored kinds and stop")
            dist = self._extended_dist(selection_obs)
            return dist.log_prob(pairs.to(selection_obs.dtype), kinds.long(), stop.to(selection_obs.dtype)), \
                dist.entropy()
        if self.config.selection_mode != "learned":
            zeros = selection_obs.new_zeros(selection_obs.shape[0])
            return zeros, zeros
        dist = self.selection.distribution(selection_obs)
        return dist.log_prob(pairs.to(selection_obs.dtype)), dist.entropy()

    # -- behavior ----------------------------------------------------------------------------------
    def _behave(self, behavior_obs: torch.Tensor, deterministic: bool, active: torch.Tensor | None = None):
        batch, n_agents, _ = behavior_obs.shape
        zeros = behavior_obs.new_zeros(batch)
        if self.config.behavior_mode == "fixed":
            raw = behavior_obs.new_tensor(self._fixed_raw).expand(batch, n_agents, 2).clone()
            return raw, zeros, zeros
        dist = self.behavior.distribution(behavior_obs)
        raw = dist.mean if deterministic else dist.sample()
        return (raw, *self._behavior_logp_entropy(dist, raw, active))

    @staticmethod
    def _behavior_logp_entropy(dist: Independent, raw: torch.Tensor, active: torch.Tensor | None,
                               per_dim: bool = False):
        """Log-prob and entropy of the agents whose (T, top-p) act (`active` (B, V); None = all of them)."""
        logp = dist.base_dist.log_prob(raw)  # (B, V, 2)
        ent = dist.base_dist.entropy()
        if active is not None:
            logp, ent = logp * active.unsqueeze(-1), ent * active.unsqueeze(-1)
        if per_dim:
            return logp.reshape(raw.shape[0], -1), ent.sum((-2, -1))
        return logp.sum((-2, -1)), ent.sum((-2, -1))

    def evaluate_behavior(self, behavior_obs: torch.Tensor, raw_behavior: torch.Tensor, per_dim: bool = False,
                          active: torch.Tensor | None = None):
        """(logp (B,), entropy (B,)) of stored raw samples (B, V, 2); zeros for behavior_mode="fixed".
        `per_dim`: logp per agent and dimension, (B, 2V) agent-major, instead of their sum. `active` (B, V): only
        these agents' samples count (extended actions: a kept turn or a stopped debate used no sampling)."""
        if self.config.behavior_mode != "learned":
            zeros = behavior_obs.new_zeros(behavior_obs.shape[0])
            return (zeros.unsqueeze(-1) if per_dim else zeros), zeros
        dist = self.behavior.distribution(behavior_obs)
        raw = raw_behavior.to(behavior_obs.dtype)
        active = None if active is None else active.to(behavior_obs.dtype)
        return self._behavior_logp_entropy(dist, raw, active, per_dim)

    # -- joint -------------------------------------------------------------------------------------
    def _behavior_input(self, selection_obs: torch.Tensor, b: torch.Tensor, u: torch.Tensor,
                        pairs: torch.Tensor) -> torch.Tensor:
        """The behavior observation under the chosen pairs; with the profile feature, each agent's one-hot (read
        from the selection input, where it follows the paper's features) is appended."""
        obs = behavior_observation(b, u, pairs_to_mask(pairs, self.n_agents), rule=self.config.fusion)
        if not self.config.n_profiles:
            return obs
        v, start = self.n_agents, selection_obs_dim(self.n_agents)
        onehots = selection_obs[:, start: start + v * self.config.n_profiles].reshape(-1, v, self.config.n_profiles)
        return torch.cat([obs, onehots.to(obs.dtype)], dim=-1)

    @torch.no_grad()
    def act(
        self, selection_obs: torch.Tensor, b: torch.Tensor, u: torch.Tensor, deterministic: bool = False
    ) -> ActOutput:
        """Sample (or take the mode of) both actors' actions for a batch of debates.

        ``selection_obs`` (B, `selection_obs_dim`), ``b`` (B, V, V), ``u`` (B, V) come from the regulator's
        `BeliefObservation` (or the env observation). Deterministic: pairs = 1[p > 0.5], raw = mean.
        """
        device = self.behavior.log_std.device  # inputs may come from numpy/CPU; compute where the nets are
        selection_obs, b, u = (torch.as_tensor(x, dtype=torch.float32, device=device) for x in (selection_obs, b, u))
        kinds = stop = active = None
        if self.extended:
            pairs, kinds, stop, logp_s, ent_s = self._select_extended(selection_obs, deterministic)
            active = (1.0 - stop).unsqueeze(-1) * (kinds != KEEP).to(stop.dtype)
        else:
            pairs, logp_s, ent_s = self._select(selection_obs, deterministic)
        behavior_obs = self._behavior_input(selection_obs, b, u, pairs)
        mask = pairs_to_mask(pairs, self.n_agents)
        raw, logp_b, ent_b = self._behave(behavior_obs, deterministic, active)
        sampling = to_sampling(
            raw.clamp(-RAW_BOUND, RAW_BOUND), self.config.temperature_range, self.config.top_p_range,
            self.config.behavior_map,
        )
        return ActOutput(
            mask=mask,
            pairs=pairs,
            raw_behavior=raw,
            behavior_obs=behavior_obs,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            logp_selection=logp_s,
            logp_behavior=logp_b,
            entropy_selection=ent_s,
            entropy_behavior=ent_b,
            kinds=kinds,
            stop=stop,
            behavior_active=active,
        )

    def evaluate_actions(
        self,
        selection_obs: torch.Tensor,
        pairs: torch.Tensor,
        raw_behavior: torch.Tensor,
        behavior_obs: torch.Tensor | None = None,
        b: torch.Tensor | None = None,
        u: torch.Tensor | None = None,
    ) -> EvalOutput:
        """Log-probs/entropies of stored actions for PPO ratios (with gradients).

        Pass the stored ``behavior_obs`` (preferred) or ``b``/``u`` to recompute it from the stored mask.
        """
        if behavior_obs is None:
            if b is None or u is None:
                raise ValueError("evaluate_actions: pass behavior_obs or both b and u")
            behavior_obs = self._behavior_input(selection_obs, b, u, pairs)
        logp_s, ent_s = self.evaluate_selection(selection_obs, pairs)
        logp_b, ent_b = self.evaluate_behavior(behavior_obs, raw_behavior)
        return EvalOutput(
            logp_selection=logp_s, logp_behavior=logp_b, entropy_selection=ent_s, entropy_behavior=ent_b
        )
