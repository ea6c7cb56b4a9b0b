"""Gymnasium environments of DEAR: the debate POMDP (`dear/Debate-v0`) and its batched vector env.

import envs, gymnasium
env = gymnasium.make("dear/Debate-v0", llm="sim", task="synthetic", n_agents=3, n_rounds=2)
venv = gymnasium.make_vec("dear/Debate-v0", num_envs=64, vectorization_mode="vector_entry_point", llm="sim")
"""

import gymnasium

ENV_ID = "dear/Debate-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(
        id=ENV_ID,
        entry_point="envs.debate_env:DebateEnv",
        vector_entry_point="envs.vector_env:DebateVectorEnv",
        # The debate itself ends after n_rounds steps; no TimeLimit wrapper needed.
        max_episode_steps=None,
        # Gymnasium's passive checker stays on: it only inspects the outputs of the first real reset/step
        # against the spaces (no extra reset/step calls, so no extra LLM calls) and catches layout mistakes.
        disable_env_checker=False,
    )

from envs.debate_env import DebateCore, DebateEnv, DebateEnvConfig, ParsedAction  # noqa: E402
from envs.vector_env import DebateVectorEnv  # noqa: E402

__all__ = ["ENV_ID", "DebateCore", "DebateEnv", "DebateVectorEnv", "DebateEnvConfig", "ParsedAction"]
