"""Checkpoints: everything needed to continue a run exactly where it stopped.

Layout of `RUN_DIR/checkpoints/iter_XXXXXX/`:
    model.safetensors   selection.*, behavior.*, critic.*, value_norm.* tensors
    optimizer.pt        Adam states of the three optimisers (torch.save; loaded with weights_only=True)
    state.json          iteration and step counters, restart counters, python/numpy RNG states
    torch_rng.safetensors  torch CPU generator state
    config.yaml         the merged config of the run
    checksums.json      sha256 of each file above, recorded at save time (dear.integrity)
`RUN_DIR/checkpoints/latest` names the newest complete checkpoint; it is written last (atomic rename),
so a crash mid-save leaves the previous checkpoint as the latest good one.
Loading verifies every checksum first: a damaged file raises `CheckpointError` naming it, as does a file that
cannot be parsed or weights that do not fit the config. Checkpoints written before checksums existed load with
a warning (and their weights are still checked for NaN/inf).
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dear.atomic import write_json
from dear.integrity import (
    CHECKSUMS_FILE,
    IntegrityError,
    atomic_write_text,
    read_json,
    verify_checkpoint_checksums,
    write_checksums,
)
from train.algorithm import HAPPO

CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt", "torch_rng.safetensors", "state.json", "config.yaml")


class CheckpointError(IntegrityError):
    """A checkpoint file is missing, damaged, unparsable or does not fit the run's config (the message names it)."""


@dataclass
class Counters:
    iteration: int = 0  # completed HAPPO iterations
    global_step: int = 0  # env steps (debate rounds) collected
    episodes: int = 0  # debates collected
    worker_restarts: int = 0
    episodes_redone: int = 0
    tokens: int = 0
    failed_episodes: int = 0  # debates that failed (a backend request gave up) and were left out of the update


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
    write_json(tmp / "state.json", state)
    (tmp / "config.yaml").write_text(config_yaml)
    write_checksums(tmp, CHECKPOINT_FILES, CHECKSUMS_FILE)
    final = ckpt_root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(ckpt_root / "latest", name)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `checkpoints/latest` names; None when the run has none. A pointer that names a missing
    directory raises CheckpointError naming the pointer."""
    ptr = Path(run_dir) / "checkpoints" / "latest"
    if not ptr.exists():
        return None
    name = ptr.read_text(errors="replace").strip()
    path = ptr.parent / name
    if not name or "/" in name or not path.is_dir():
        raise CheckpointError(f"{ptr}: names {name!r}, which is not a checkpoint directory in {ptr.parent}")
    return path


def verify_checkpoint(path: Path) -> bool:
    """Check the checksums of a checkpoint; True when verified, False when it predates checksums (warned)."""
    path = Path(path)
    if not (path / "model.safetensors").exists():
        raise CheckpointError(f"{path}: not a checkpoint (model.safetensors missing)")
    try:
        return verify_checkpoint_checksums(path)
    except IntegrityError as e:
        raise CheckpointError(str(e)) from None


def _read(path: Path, what: str, reader):
    try:
        return reader(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {what} is missing") from None
    except (SafetensorError, RuntimeError, EOFError, OSError, ValueError, KeyError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"{path}: {what} cannot be read (damaged or truncated?): "
                              f"{type(e).__name__}: {e}") from None


def load_checkpoint(path: Path, learner: HAPPO) -> tuple[Counters, dict[str, Any]]:
    """Verify, then restore weights, optimisers, value normaliser and RNG states; returns (counters, state.json)."""
    path = Path(path)
    verify_checkpoint(path)
    tensors = _read(path / "model.safetensors", "model weights", lambda p: load_file(str(p)))
    bad = sorted(k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all())
    if bad:
        raise CheckpointError(f"{path / 'model.safetensors'}: non-finite values in {bad[:5]}")
    try:
        load_weights(learner, tensors)
    except RuntimeError as e:
        raise CheckpointError(f"{path / 'model.safetensors'}: weights do not fit this run's config (changed "
                              f"env.n_agents or policy sizes?): {e}") from None
    optim = _read(path / "optimizer.pt", "optimizer state", lambda p: torch.load(p, weights_only=True))
    try:
        learner.load_optimizer_state(optim)
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path / 'optimizer.pt'}: optimizer state does not fit this run: {e}") from None
    rng = _read(path / "torch_rng.safetensors", "torch RNG state", lambda p: load_file(str(p))["torch_cpu"])
    try:
        state = read_json(path / "state.json", "checkpoint state")
        v, internal, gauss = state["python_rng"]
        kind, keys, pos, has_gauss, cached = state["numpy_rng"]
        counters = Counters(**state["counters"])
    except IntegrityError as e:
        raise CheckpointError(str(e)) from None
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path / 'state.json'}: missing or malformed entry: {type(e).__name__}: {e}") from None
    torch.set_rng_state(rng)
    random.setstate((v, tuple(internal), gauss))
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    return counters, state
