"""Training with a mixed pool seated in a shuffled order and the profile feature on (issue 42 item 2): the
policy learns with the wider observations and exports with its profile vocabulary."""

from __future__ import annotations

import json

import pytest

from dear.export import export_policy, load_exported
from dear.policy import selection_obs_dim
from train.config import ConfigError, load_config
from train.runner import Trainer
from tests.train.test_train_device import SMALL

POOL = 'env.agent_profiles=[{"style": "cot"}, {"style": "cot"}, {"style": "direct"}]'


def test_training_with_shuffled_seats_and_the_feature_runs_and_exports(tmp_path):
    cfg = load_config("sim-stylised", [*SMALL, f"run.out_dir={tmp_path}", "run.iterations=1", POOL,
                                       "env.shuffle_profiles=true", "env.profile_feature=true"])
    tr = Trainer(cfg, run_dir=tmp_path / "run")
    tr.train()
    tr.close()
    policy = tr.learner.policy
    assert policy.config.profiles == ("cot", "direct")
    out = export_policy(policy, tmp_path / "p", encoder="hashing")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["observation"]["selection"]["dim"] == selection_obs_dim(3, "paper", 2)
    assert load_exported(out).policy.config.profiles == ("cot", "direct")


@pytest.mark.parametrize("key", ["env.profile_feature", "env.shuffle_profiles"])
def test_the_keys_need_a_pool(key):
    with pytest.raises(ConfigError, match=f"{key}: needs env.agent_profiles"):
        load_config("sim-stylised", [f"{key}=true"])
