"""Batched debate rollouts: `num_envs` sub-debates whose agents share ONE backend call per round.

Unlike gymnasium's SyncVectorEnv (one env.step per sub-env, so one LLM call per debate), `step` builds every
sub-debate's RoundControl and issues a single `DebateEngine.step`, so llama.cpp slots / vLLM batching see
num_envs * V requests at once. Round 0 of (re)started debates is likewise one `DebateEngine.start` call.

Autoreset: ``AutoresetMode.SAME_STEP`` (``metadata["autoreset_mode"]``). When sub-debate k finishes in a step,
the returned ``obs[k]`` is already the first observation of its next debate, and
``infos["final_obs"][k]`` / ``infos["final_info"][...][k]`` (with boolean masks ``infos["_final_obs"]``,
``infos["final_info"]["_<key>"]``) hold the terminal observation and the terminal info: reward parts,
``final_correct``, ``tokens_total``, ``answers_per_round`` / ``correct_per_round`` / ``masks_per_round``
((R+1) x V views for transitions, HCR and BCR), ``episode_return``, ``episode_length`` and the
``episode`` (``envs.debate_env.EpisodeSummary``, with the full DebateTrace). Such a step makes two generate calls: the last exchange round and round 0
of the new debates (still one call per round). With a fixed number of rounds all sub-debates end together.

``autoreset_mode=AutoresetMode.DISABLED`` (constructor kwarg) is also supported: finished sub-debates stay
finished (their terminal info is in the step's ``infos`` directly), stepping one raises, and
``reset(options={"reset_mask": mask})`` restarts only the masked ones (gymnasium's DISABLED convention).
Rollouts that end every debate at the same step and start each chunk with a seeded reset use it to avoid
generating round 0 of debates that would never be stepped. One exception keeps such lock-step rollouts going
when a backend request fails: a sub-debate that *failed* (``info["failed"]``, it ended early) is carried along
by later steps as a no-op — no request, reward 0, ``terminated`` True, its terminal observation, and
``info["frozen"]`` True — so the other sub-debates can finish their rounds.

Actions are batched like the observations: ``{"mask": (N, V(V-1)) 0/1, "behavior": (N, 2V) float}``
(see `envs.debate_env` for the layout; `dear.policy.ActOutput.env_action()` produces exactly this).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from dear.debate.engine import Debate
from dear.evidence import Encoder
from dear.llm.base import Backend
from dear.regulator import BeliefObservation
from dear.tasks.types import Question
from envs.debate_env import DebateCore, DebateEnvConfig
from envs.reward import potential


class DebateVectorEnv(VectorEnv):
    """``num_envs`` debates stepped in lock-step with one backend call per round (SAME_STEP autoreset).

    Constructor kwargs are those of `envs.debate_env.DebateEnv` plus ``num_envs``. Also reachable as
    ``gymnasium.make_vec("dear/Debate-v0", num_envs=N, vectorization_mode="vector_entry_point", ...)``.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        num_envs: int = 8,
        llm: str | Backend = "sim",
        encoder: str | Encoder | None = None,
        questions: Sequence[Question] | None = None,
        llm_kwargs: Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.SAME_STEP,
        **knobs: Any,  # the DebateEnvConfig fields (task, n_agents, token_cost, ...), declared there only
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        mode = AutoresetMode(autoreset_mode)
        if mode not in (AutoresetMode.SAME_STEP, AutoresetMode.DISABLED):
            raise ValueError(f"autoreset_mode must be SAME_STEP or DISABLED, got {mode}")
        self.autoreset_mode = mode
        self.metadata = {**type(self).metadata, "autoreset_mode": mode}
        self.config = DebateEnvConfig.from_keywords(knobs, "DebateVectorEnv")
        self.core = DebateCore(
            self.config, llm=llm, encoder=encoder, questions=questions, llm_kwargs=llm_kwargs
        )
        self.single_observation_space = self.core.observation_space
        self.single_action_space = self.core.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.render_mode = render_mode
        self.debates: list[Debate | None] = [None] * num_envs
        self.last_belief: BeliefObservation | None = None  # torch (b, u, ...) of the returned observations
        self._rngs: list[np.random.Generator] = []
        self._prev_frac = np.zeros(num_envs)
        self._returns = np.zeros(num_envs)
        self._ended = np.zeros(num_envs, dtype=bool)  # DISABLED mode: finished, waiting for a reset

    @property
    def backend(self) -> Backend:
        return self.core.backend

    @property
    def engine(self):
        return self.core.engine

    # ------------------------------------------------------------------ helpers
    # Per-round terminal arrays: (rounds run, ...) differs between a debate that failed early and one that
    # finished, so they are kept per sub-debate in an object array instead of one stacked array.
    _PER_ROUND_INFO = ("correct_per_round", "masks_per_round")

    def _add_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        for key in self._PER_ROUND_INFO:
            if key in env_info and key not in vector_infos:
                vector_infos[key] = np.full(self.num_envs, None, dtype=object)
        return super()._add_info(vector_infos, env_info, env_num)

    def _stack(self, obs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {k: np.stack([o[k] for o in obs]) for k in self.single_observation_space.spaces}

    def _start(self, envs: list[int], question_indices: Sequence[int | None] | None = None) -> None:
        idx = question_indices if question_indices is not None else [None] * len(envs)
        new = self.core.start([self._rngs[k] for k in envs], idx)
        for k, d in zip(envs, new):
            self.debates[k] = d
            self._prev_frac[k] = potential(d)
            self._returns[k] = 0.0
            self._ended[k] = False

    def _split_actions(self, actions: Any) -> list[Mapping[str, Any]]:
        keys = self.core.action_keys
        if not isinstance(actions, Mapping) or set(actions) != set(keys):
            got = sorted(map(str, actions)) if isinstance(actions, Mapping) else type(actions).__name__
            raise ValueError(f"actions must be a dict with keys {keys} of batched arrays, got {got}")
        for key in keys:
            n = len(actions[key]) if hasattr(actions[key], "__len__") else -1
            if n != self.num_envs:
                raise ValueError(
                    f"actions['{key}'] must have num_envs={self.num_envs} rows, got {np.shape(actions[key])}"
                )
        return [{key: actions[key][k] for key in keys} for k in range(self.num_envs)]

    # ------------------------------------------------------------------ API
    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None):
        """Start num_envs debates. ``seed`` int seeds sub-debate k with ``seed + k``; a list gives each seed.
        ``options={"question_index": [..]}`` pins the questions (one index per sub-env);
        ``options={"reset_mask": bool array}`` restarts only the masked sub-debates (DISABLED mode)."""
        super().reset(seed=seed if isinstance(seed, int) or seed is None else None)
        if seed is None:
            seeds = [None] * self.num_envs
        elif isinstance(seed, int):
            seeds = [seed + k for k in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset: seed list has {len(seeds)} entries for num_envs={self.num_envs}")
        if seed is not None or not self._rngs:
            if seed is None:  # first reset without a seed: fresh entropy, like gymnasium
                seeds = [int(s) for s in np.random.SeedSequence().generate_state(self.num_envs)]
            self._rngs = [np.random.default_rng(s) for s in seeds]
        options = dict(options or {})
        unknown = set(options) - {"question_index", "reset_mask"}
        if unknown:
            raise ValueError(
                f"reset options: unknown keys {sorted(unknown)}; known: ['question_index', 'reset_mask']"
            )
        qidx = options.get("question_index")
        if qidx is not None and len(qidx) != self.num_envs:
            raise ValueError(
                f"options['question_index'] needs num_envs={self.num_envs} entries, got {len(qidx)}"
            )
        reset_mask = options.get("reset_mask")
        if reset_mask is None:
            envs = list(range(self.num_envs))
        else:
            reset_mask = np.asarray(reset_mask)
            if reset_mask.shape != (self.num_envs,) or reset_mask.dtype != bool:
                raise ValueError(
                    f"options['reset_mask'] must be a bool array of shape ({self.num_envs},), "
                    f"got {reset_mask.dtype} {reset_mask.shape}"
                )
            envs = [int(k) for k in np.flatnonzero(reset_mask)]
            if any(self.debates[k] is None for k in range(self.num_envs) if k not in envs):
                raise ValueError("options['reset_mask']: the first reset must start every sub-debate")
        if envs:
            self._start(envs, [qidx[k] for k in envs] if qidx is not None else None)
        obs, self.last_belief = self.core.observe(self.debates)
        infos: dict[str, Any] = {}
        for k in envs:
            infos = self._add_info(infos, self.core.round_info(self.debates[k]), k)
        return self._stack(obs), infos

    def step(self, actions):
        if any(d is None for d in self.debates):
            raise RuntimeError("DebateVectorEnv.step called before reset()")
        # DISABLED mode: failed and stopped sub-debates ride along as no-ops; those that ran every round wait for
        # a reset.
        frozen = self._ended & np.array([bool(d.failed) or d.round < d.n_rounds  # type: ignore[union-attr]
                                         for d in self.debates])
        waiting = self._ended & ~frozen
        if waiting.any():
            raise RuntimeError(
                f"sub-debates {np.flatnonzero(waiting).tolist()} have finished and autoreset is "
                "DISABLED; restart them with reset(options={'reset_mask': ...})"
            )
        parsed = [
            self.core.parse_action(a, where=f"actions[{k}]")
            for k, a in enumerate(self._split_actions(actions))
        ]
        debates: list[Debate] = list(self.debates)  # type: ignore[arg-type]
        self.core.engine.step(debates, self.core.controls(parsed))  # ONE backend call for every sub-debate

        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=bool)
        truncations = np.zeros(self.num_envs, dtype=bool)
        step_infos = []
        for k, d in enumerate(debates):
            if frozen[k]:  # failed in an earlier step; the engine skipped it
                terminations[k] = True
                step_infos.append({**self.core.round_info(d), "mask": parsed[k].mask, "frozen": True})
                continue
            reward, parts = self.core.reward(d, self._prev_frac[k])
            self._prev_frac[k] = potential(d)
            self._returns[k] += reward
            rewards[k] = reward
            terminations[k] = d.done
            info = self.core.round_info(d)
            info.update(parts)
            info["mask"] = parsed[k].mask
            if d.done:
                info["episode_return"] = float(self._returns[k])
                info["episode_length"] = int(d.round)
            step_infos.append(info)

        obs, belief = self.core.observe(debates)
        infos: dict[str, Any] = {}
        done = [k for k in range(self.num_envs) if terminations[k]]
        if self.autoreset_mode == AutoresetMode.DISABLED:
            self._ended |= terminations
            done = []  # terminal infos go straight into `infos`; the caller resets
        if done:
            for k in done:
                infos = self._add_info(infos, {"final_obs": obs[k], "final_info": step_infos[k]}, k)
            self._start(done)  # round 0 of the next debates: ONE backend call
            obs, belief = self.core.observe(self.debates)
            for k in done:
                step_infos[k] = self.core.round_info(self.debates[k])
        self.last_belief = belief
        for k in range(self.num_envs):
            infos = self._add_info(infos, step_infos[k], k)
        return self._stack(obs), rewards, terminations, truncations, infos

    def close_extras(self, **kwargs):
        self.core.close()
