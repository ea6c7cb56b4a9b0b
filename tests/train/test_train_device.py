"""`run.device`: every learner tensor (parameters, buffers, value normaliser, Adam moments) lives on it,
after construction and after `--resume`; an update on CUDA matches the CPU one (skipped without a GPU)."""

from __future__ import annotations

import math

import pytest
import torch

from dear.policy import Critic, JointPolicy, PolicyConfig
from dear.regulator import state_dim
from train.algorithm import HAPPO, resolve_device
from train.config import ConfigError, HAPPOConfig, load_config
from train.happo import build_config, parse_args
from train.runner import Trainer
from tests.train.test_train_algorithm import V, _batch

SMALL = ["logging.progress=false", "rollout.num_workers=0", "rollout.envs_per_worker=4", "rollout.group_size=1",
         "rollout.episodes_per_iter=4", "run.iterations=1"]


def learner_tensors(learner: HAPPO) -> dict[str, torch.Tensor]:
    """Every tensor the update reads or writes, named (enumerated here, not by the code under test)."""
    out = {}
    for prefix, module in (("policy", learner.policy), ("critic", learner.critic), ("value_norm", learner.value_norm)):
        out.update({f"{prefix}.{k}": v for k, v in module.named_parameters()})
        out.update({f"{prefix}.{k}": v for k, v in module.named_buffers()})
    for name, opt in learner.optimizers.items():
        for group in opt.param_groups:
            for i, p in enumerate(group["params"]):
                out[f"{name}.param{i}"] = p
                for key, st in opt.state.get(p, {}).items():
                    if key != "step":  # torch keeps Adam's step counter a CPU scalar on purpose
                        out[f"{name}.param{i}.{key}"] = st
    return out


def _off_device(learner: HAPPO, device: str) -> list[str]:
    return [f"{k} on {v.device}" for k, v in learner_tensors(learner).items() if v.device.type != device]


@pytest.mark.filterwarnings("ignore:.*to a meta parameter:UserWarning")  # meta copies hold no data, by design
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_every_learner_tensor_on_run_device_after_construction_and_resume(tmp_path, device):
    # A run on CPU writes one checkpoint (so Adam moments exist) ...
    cpu_run = tmp_path / "run"
    tr = Trainer(load_config("sim-stylised", [*SMALL, f"run.out_dir={tmp_path}", "run.device=cpu"]), run_dir=cpu_run)
    tr.train()
    tr.close()
    # ... a fresh trainer on `device` holds everything there (no Adam state yet) ...
    fresh = Trainer(load_config("sim-stylised", [*SMALL, f"run.out_dir={tmp_path}", f"run.device={device}"]),
                    run_dir=tmp_path / "fresh")
    fresh.close()
    assert fresh.learner.device.type == device
    assert len(learner_tensors(fresh.learner)) > 20
    assert _off_device(fresh.learner, device) == []
    # ... and `--resume RUN_DIR run.device=...` puts the restored weights and Adam moments there too.
    cfg = build_config(parse_args(["--resume", str(cpu_run), f"run.device={device}", "logging.progress=false"]))
    resumed = Trainer(cfg, run_dir=cpu_run, resume=True)
    resumed.close()
    moments = [k for k in learner_tensors(resumed.learner) if k.endswith("exp_avg_sq")]
    assert len(moments) == sum(len(list(m.parameters())) for m in (resumed.policy, resumed.critic))
    assert _off_device(resumed.learner, device) == []


def test_a_cpu_tensor_would_be_caught():
    """The check above can fail: a module left on CPU is reported."""
    learner = HAPPO(JointPolicy(PolicyConfig(n_agents=V)), Critic(state_dim(V), 16), HAPPOConfig(), "meta")
    learner.critic.obs_norm.mean = torch.zeros(state_dim(V))  # a stray CPU buffer
    assert _off_device(learner, "meta") == ["critic.obs_norm.mean on cpu"]


def test_device_option_auto_and_errors(monkeypatch):
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"run.device.*cuda.is_available\(\) is False"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match="run.device"):
        load_config("sim-stylised", ["run.device=gpu0"])


def test_optimizer_state_saved_on_cpu():
    learner = HAPPO(JointPolicy(PolicyConfig(n_agents=V)), Critic(state_dim(V), 16), HAPPOConfig(update_epochs=1))
    learner.update(_batch(learner), torch.Generator().manual_seed(0))
    state = learner.optimizer_state()
    tensors = [t for o in state.values() for st in o["state"].values() for t in st.values()]
    assert tensors and all(t.device.type == "cpu" for t in tensors)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_update_on_cuda_matches_cpu():
    def learner(device):
        torch.manual_seed(0)
        return HAPPO(JointPolicy(PolicyConfig(n_agents=V)), Critic(state_dim(V), 32),
                     HAPPOConfig(update_epochs=2, num_minibatches=2), device)

    batch = _batch(learner("cpu"), episodes=16)  # a CPU batch, as the rollouts deliver it
    results = {}
    for device in ("cpu", "cuda"):
        happo = learner(device)
        results[device] = happo.update(batch, torch.Generator().manual_seed(1))
        assert _off_device(happo, device) == []
    for k, v in results["cpu"].items():
        if math.isfinite(v):
            assert results["cuda"][k] == pytest.approx(v, rel=1e-3, abs=1e-4), k
