"""`happo.anneal_lr`: every learning rate falls linearly from its configured value towards 0 over
`run.iterations` (CleanRL's schedule), and a resumed run continues the same schedule."""

from __future__ import annotations

import json

import pytest

from train.config import load_config
from train.runner import Trainer
from tests.train.test_train_device import SMALL


def logged_lrs(run_dir) -> list[tuple[float, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["synthetic/charts/learning_rate_selection"], r["synthetic/charts/learning_rate_behavior"]) for r in rows]


def test_learning_rates_fall_linearly_and_resume_on_schedule(tmp_path):
    run = tmp_path / "run"
    over = [*SMALL, f"run.out_dir={tmp_path}", "run.checkpoint_every=1"]  # annealing is the default
    tr = Trainer(load_config("sim-stylised", [*over, "run.iterations=2"]), run_dir=run)
    tr.train()
    tr.close()
    # a run planned for 4 iterations that stopped after 2 continues at 2/4 and 1/4 of the rates
    cfg = load_config("sim-stylised", [*over, "run.iterations=4"])
    tr = Trainer(cfg, run_dir=run, resume=True)
    tr.train()
    tr.close()
    lr_sel, lr_beh = cfg.happo.lr_selection, cfg.happo.lr_behavior
    first_two = [(lr_sel, lr_beh), (lr_sel / 2, lr_beh / 2)]  # the first run's plan: 2 iterations
    last_two = [(lr_sel / 2, lr_beh / 2), (lr_sel / 4, lr_beh / 4)]
    assert logged_lrs(run) == pytest.approx(first_two + last_two)


def test_without_annealing_the_rates_stay(tmp_path):
    tr = Trainer(load_config("sim-stylised", [*SMALL, f"run.out_dir={tmp_path}", "run.iterations=2",
                                              "happo.anneal_lr=false"]), run_dir=tmp_path / "run")
    tr.train()
    tr.close()
    cfg = tr.cfg
    assert logged_lrs(tmp_path / "run") == pytest.approx([(cfg.happo.lr_selection, cfg.happo.lr_behavior)] * 2)
