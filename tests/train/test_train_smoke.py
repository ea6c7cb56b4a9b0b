"""A 1-iteration real-model run of the CLI with configs/smoke.yaml (SmolLM2-135M through llama.cpp,
one Ray rollout worker + the shared LLM engine actor)."""

import json
import subprocess
import sys

import pytest

from train.checkpoint import latest_checkpoint


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smoke_config_one_iteration_real_model(tmp_path):
    cmd = [sys.executable, "-m", "train.happo", "--config", "smoke", "--run-dir", str(tmp_path / "run"),
           "run.iterations=1", "logging.progress=true"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=880)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "HAPPO" in res.stderr and "tok/s=" in res.stderr  # the live progress line
    run = tmp_path / "run"
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["synthetic"] is False and row["iteration"] == 1
    assert not any(k.startswith("synthetic/") for k in row)
    assert row["rollout/tokens_per_question"] > 0 and row["charts/SPS"] > 0
    assert row["rollout/failed_debates"] == 0
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and (ckpt / "model.safetensors").exists()
