"""Checkpoints: everything needed to continue a run exactly where it stopped.

Layout of `RUN_DIR/checkpoints/iter_XXXXXX/`:
    model.safetensors   selection.*, behavior.*, critic.*, value_norm.* tensors
    optimizer.pt        Adam states of the three optimisers (torch.save; loaded with weights_only=True)
    state.json          iteration and step counters, restart counters, python/numpy RNG states
    torch_rng.safetensors  torch CPU generator state
    config.yaml         the merged config of the run
`RUN_DIR/checkpoints/latest` names the newest complete checkpoint; it is written last (atomic rename),
so a crash mid-save leaves the previous checkpoint as the latest good one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from train.algorithm import HAPPO


@dataclass
class Counters:
    iteration: int = 0  # completed HAPPO iterations
    global_step: int = 0  # env steps (debate rounds) collected
    episodes: int = 0  # debates collected
    worker_restarts: int = 0
    episodes_redone: int = 0
    tokens: int = 0


def _state_tensors(learner: HAPPO) -> dict[str, torch.Tensor]:
    out = {}
    for prefix, module in (("selection", learner.policy.selection), ("behavior", learner.policy.behavior),
                           ("critic", learner.critic), ("value_norm", learner.value_norm)):
        for k, v in module.state_dict().items():
            out[f"{prefix}.{k}"] = v.detach().cpu().contiguous()
    return out


def load_weights(learner: HAPPO, tensors: dict[str, torch.Tensor]) -> None:
    for prefix, module in (("selection", learner.policy.selection), ("behavior", learner.policy.behavior),
                           ("critic", learner.critic), ("value_norm", learner.value_norm)):
        sd = {k[len(prefix) + 1:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
        module.load_state_dict(sd)


def save_checkpoint(run_dir: Path, learner: HAPPO, counters: Counters, config_yaml: str,
                    extra: dict[str, Any] | None = None) -> Path:
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    name = f"iter_{counters.iteration:06d}"
    tmp = ckpt_root / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file(_state_tensors(learner), str(tmp / "model.safetensors"),
              metadata={"format": "dear-happo-checkpoint", "iteration": str(counters.iteration)})
    torch.save(learner.optimizer_state(), tmp / "optimizer.pt")
    save_file({"torch_cpu": torch.get_rng_state()}, str(tmp / "torch_rng.safetensors"))
    py_state = random.getstate()
    np_state = np.random.get_state()
    state = {
        "counters": asdict(counters),
        "python_rng": [py_state[0], list(py_state[1]), py_state[2]],
        "numpy_rng": [np_state[0], np_state[1].tolist(), *[x for x in np_state[2:]]],
        **(extra or {}),
    }
    (tmp / "state.json").write_text(json.dumps(state))
    (tmp / "config.yaml").write_text(config_yaml)
    final = ckpt_root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = ckpt_root / ".latest.tmp"
    latest_tmp.write_text(name)
    os.replace(latest_tmp, ckpt_root / "latest")
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    ptr = Path(run_dir) / "checkpoints" / "latest"
    if not ptr.exists():
        return None
    path = ptr.parent / ptr.read_text().strip()
    return path if path.exists() else None


def load_checkpoint(path: Path, learner: HAPPO) -> tuple[Counters, dict[str, Any]]:
    """Restore weights, optimisers, value normaliser and RNG states; returns (counters, state.json)."""
    path = Path(path)
    if not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"no checkpoint at {path} (model.safetensors missing)")
    load_weights(learner, load_file(str(path / "model.safetensors")))
    learner.load_optimizer_state(torch.load(path / "optimizer.pt", weights_only=True))
    torch.set_rng_state(load_file(str(path / "torch_rng.safetensors"))["torch_cpu"])
    state = json.loads((path / "state.json").read_text())
    v, internal, gauss = state["python_rng"]
    random.setstate((v, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy_rng"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return Counters(**state["counters"]), state
