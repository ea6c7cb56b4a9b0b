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
    # the command line's path, from the run directory's config.yaml, builds the same policy
    from dear.export import export_checkpoint

    again = load_exported(export_checkpoint(tmp_path / "run", tmp_path / "from-run")).policy
    assert again.config.profiles == ("cot", "direct") and not again.config.decision_features
    for a, b in zip(again.state_dict().values(), policy.state_dict().values()):
        assert (a == b).all()


@pytest.mark.parametrize("key", ["env.profile_feature", "env.shuffle_profiles"])
def test_the_keys_need_a_pool(key):
    with pytest.raises(ConfigError, match=f"{key}: needs env.agent_profiles"):
        load_config("sim-stylised", [f"{key}=true"])


def test_read_rates_follow_each_profile_from_seat_to_seat(tmp_path, capsys):
    from train import read_rates

    cfg = load_config("sim-stylised", [*SMALL, f"run.out_dir={tmp_path}", "run.iterations=1", POOL,
                                       "env.shuffle_profiles=true", "env.profile_feature=true"])
    tr = Trainer(cfg, run_dir=tmp_path / "run")
    tr.train()
    tr.close()
    # the saved run's policy reads as the trainer's does, and its rates add up over the pool's ordered pairs
    policy = read_rates.load_run_policy(tmp_path / "run", cfg)
    for a, b in zip(policy.state_dict().values(), tr.learner.policy.state_dict().values()):
        assert (a == b).all()
    rates = read_rates.read_rates(cfg, policy, episodes=12, seed=5)
    assert {(x.reader, x.read) for x in rates} == {("cot", "cot"), ("cot", "direct"), ("direct", "cot")}
    for r in (1, 2):  # per round: 12 debates x the pool's 6 ordered pairs (cot-cot twice, each other pair twice)
        assert sum(x.pairs for x in rates if x.round == r) == 12 * 6
    assert all(0 <= x.reads <= x.pairs and 0 < x.probability < 1 for x in rates)
    assert read_rates.main([str(tmp_path / "run"), "--episodes", "4"]) == 0
    assert "| 1 | direct | cot |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        read_rates.main([str(tmp_path), "--episodes", "4"])  # not a run directory


def test_a_run_with_the_decision_features_exports_them(tmp_path):
    from dear.export import export_checkpoint

    cfg = load_config("sim-stylised", [*SMALL, f"run.out_dir={tmp_path}", "run.iterations=1",
                                       "env.decision_features=true"])
    tr = Trainer(cfg, run_dir=tmp_path / "run")
    tr.train()
    tr.close()
    exported = load_exported(export_checkpoint(tmp_path / "run", tmp_path / "p")).policy
    assert exported.config.decision_features and exported.config.profiles is None
