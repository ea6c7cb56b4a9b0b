"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def tiny_run(tmp_path):
    """A callable that trains one tiny in-process iteration in the stylised sim world (4 debates) with the given
    dotted overrides and returns its run directory."""

    def train(*overrides: str, name: str = "run") -> Path:
        from train.config import load_config
        from train.runner import Trainer

        cfg = load_config("sim-stylised", [f"run.out_dir={tmp_path}", "logging.progress=false",
                                           "rollout.num_workers=0", "rollout.envs_per_worker=4", "rollout.group_size=1",
                                           "rollout.episodes_per_iter=4", "run.iterations=1", *overrides])
        trainer = Trainer(cfg, run_dir=tmp_path / name)
        try:
            trainer.train()
        finally:
            trainer.close()
        return tmp_path / name

    return train
