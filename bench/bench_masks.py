"""Exploratory (SYNTHETIC): fixed masks in the fitted mixed world, with silent turns as DEAR has them (an agent that
reads nobody keeps its answer without a call), on 500 synthetic questions (seed 0): accuracy, tokens and DEAR's
training objective (envs/reward.py at token_cost 0.01), each paired with reading nobody. From the repository root:

    python bench/bench_masks.py > results/eval-gsm8k-mixed/masks.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from dear import tasks  # noqa: E402
from dear.cli import run as run_cli  # noqa: E402
from dear.debate import DebateConfig, DebateEngine  # noqa: E402
from dear.debate.profiles import as_profiles  # noqa: E402
from dear.debate.protocols import make_protocol  # noqa: E402
from dear.metrics import paired_bootstrap_diff  # noqa: E402
from dear.sim.backend import SimBackend  # noqa: E402
from envs.reward import objective  # noqa: E402

PROG = "python bench/bench_masks.py"
WORLD = "worlds/gsm8k-mixed/"
TOKEN_COST = 0.01  # configs/sim.yaml env.token_cost, the objective DEAR was trained on
MASKS = {  # mask[i, j]: agent i reads agent j; agents 0 and 1 are `cot`, agent 2 is `direct`
    "read nobody": [[0, 0, 0], [0, 0, 0], [0, 0, 0]],
    "only `direct` reads the `cot` agents": [[0, 0, 0], [0, 0, 0], [1, 1, 0]],
    "the `cot` agents read each other": [[0, 1, 0], [1, 0, 0], [0, 0, 0]],
    "everyone reads the `cot` agents (the hand rule)": [[0, 1, 0], [1, 0, 0], [1, 1, 0]],
    "everyone reads everyone (MAD)": [[0, 1, 1], [1, 0, 1], [1, 1, 0]],
}


def main() -> int:
    """Run every mask on the same 500 questions and print the Markdown table."""
    questions = tasks.load("synthetic", n=500, seed=0)
    config = DebateConfig(n_agents=3, n_rounds=2, max_tokens=384, seed=0, layout="multiturn", silent=True,
                          agent_profiles=as_profiles(["sim:cot", "sim:cot", "sim:direct"], "profiles"))
    engine = DebateEngine(SimBackend(params_file=WORLD + "sim_params_synthetic_texts.json",
                                     text_bank=WORLD + "text_bank.json.gz"), config)
    scores, tokens = {}, {}
    for name, mask in MASKS.items():
        debates = engine.run(questions, make_protocol("fixed", config, mask=np.array(mask, dtype=bool)))
        scores[name] = [d.trace.final_expected for d in debates]
        tokens[name] = float(np.mean([d.trace.prompt_tokens + d.trace.completion_tokens for d in debates]))

    print("| mask (synthetic) | accuracy | tokens / question | objective | − read nobody, points [95 % CI] |")
    print("|---|---:|---:|---:|---|")
    for name in MASKS:
        d = paired_bootstrap_diff(scores[name], scores["read nobody"], seed=0)
        accuracy = float(np.mean(scores[name]))
        print(f"| {name} (synthetic) | {accuracy:.3f} | {tokens[name]:,.0f} | "
              f"{objective(accuracy, tokens[name], TOKEN_COST):.3f} | "
              f"{100 * d.mean:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}] |")
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
