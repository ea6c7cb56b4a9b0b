"""`happo.log_std_max`: the behavior Gaussian's log-std never exceeds the bound after an update, however strong
the entropy bonus pushing it up; without the bound the same bonus takes it above."""

from __future__ import annotations

import torch

from train.config import load_config
from train.runner import Trainer
from tests.train.test_train_device import SMALL


def final_log_std(tmp_path, *extra: str) -> torch.Tensor:
    # a large behavior entropy bonus drives the log-std up from its start (-0.5)
    cfg = load_config("sim-stylised", [*SMALL, f"run.out_dir={tmp_path}", "run.iterations=2",
                                       "happo.ent_coef_behavior=5.0", "happo.lr_behavior=0.05", *extra])
    tr = Trainer(cfg, run_dir=tmp_path / "run")
    tr.train()
    tr.close()
    return tr.learner.policy.behavior.log_std.detach().clone()


def test_the_bound_holds_where_the_bonus_would_pass_it(tmp_path):
    free = final_log_std(tmp_path / "free")
    bounded = final_log_std(tmp_path / "bounded", "happo.log_std_max=-0.4")
    assert (free > -0.4).all()  # without a bound the bonus passes it
    assert torch.allclose(bounded, torch.full_like(bounded, -0.4))
