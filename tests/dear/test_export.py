"""Export: a trainer checkpoint -> safetensors + manifest, loadable without the trainer, Ray or gym."""

import json
import subprocess
import sys

import pytest
import torch

from dear.export import ExportError, export_checkpoint, export_policy, load_exported
from dear.policy import JointPolicy, PolicyConfig
from tests import ROOT


def test_roundtrip_same_actions(tmp_path):
    torch.manual_seed(0)
    pol = JointPolicy(PolicyConfig(n_agents=4, temperature_range=(0.2, 1.0)))
    out = export_policy(pol, tmp_path / "exp", encoder="minilm", training={"task": "gsm8k"})
    ex = load_exported(out)
    m = ex.manifest
    assert m["n_agents"] == 4 and m["encoder"] == "minilm" and m["action"]["temperature_range"] == [0.2, 1.0]
    assert m["observation"]["selection"]["dim"] == 4 * 9 and len(m["action"]["pair_order"]) == 12
    assert m["format"] == "dear-policy" and "dear_version" in m
    b = torch.rand(5, 4, 4) * (1 - torch.eye(4)) * 0.2
    u = 1 - b.sum(-1)
    from dear.policy import selection_observation

    obs = selection_observation(b, u)
    a1 = pol.act(obs, b, u, deterministic=True)
    a2 = ex.policy.act(obs, b, u, deterministic=True)
    assert torch.equal(a1.pairs, a2.pairs) and torch.allclose(a1.temperature, a2.temperature)


def test_corrupt_or_missing_artifacts(tmp_path):
    with pytest.raises(ExportError, match="not a DEAR export"):
        load_exported(tmp_path)
    out = export_policy(JointPolicy(PolicyConfig(n_agents=3)), tmp_path / "e", encoder="hashing")
    (out / "policy.safetensors").write_bytes((out / "policy.safetensors").read_bytes()[:-4] + b"abcd")
    with pytest.raises(ExportError, match="sha256"):
        load_exported(out)


def test_export_from_trainer_checkpoint_loads_without_trainer_ray_or_gym(tmp_path):
    from train.config import load_config
    from train.runner import Trainer

    cfg = load_config("sim-stylised", [f"run.out_dir={tmp_path}", "logging.progress=false", "rollout.num_workers=0",
                                       "rollout.envs_per_worker=4", "rollout.group_size=1", "rollout.episodes_per_iter=4", "run.iterations=1"])
    tr = Trainer(cfg, run_dir=tmp_path / "run")
    tr.train()
    tr.close()
    out = export_checkpoint(tmp_path / "run", tmp_path / "exp")
    m = json.loads((out / "manifest.json").read_text())
    assert m["training"]["synthetic"] is True and m["encoder"] == "hashing" and m["training"]["iteration"] == 1
    # A fresh interpreter that blocks the trainer, Ray and gymnasium can still load and run it.
    code = f"""
import sys
for name in ("train", "ray", "gymnasium", "envs"):
    sys.modules[name] = None
from dear.export import load_exported
ex = load_exported({str(out)!r})
import torch
b = torch.zeros(2, 3, 3); u = torch.ones(2, 3)
from dear.policy import selection_observation
a = ex.policy.act(selection_observation(b, u), b, u, deterministic=True)
print(a.pairs.shape[1], float(a.temperature.min()) >= 0.1)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["6", "True"]
    tensors = torch.load  # noqa: F841  (keeps flake quiet about unused torch in some envs)
    w = tr.policy.state_dict()
    ex = load_exported(out)
    for k, v in ex.policy.state_dict().items():
        assert torch.equal(v, w[k]), k


def test_export_verifies_the_checkpoint_and_refuses_a_non_empty_out_dir(tmp_path, capsys, tiny_run):
    from dear.cli import exit_code
    from dear.export import main

    def cli(argv: list[str]) -> int:  # `python -m dear.export ARGV`: its exit code and error line
        return exit_code(lambda: main(argv), "python -m dear.export", argv=argv)

    run = tiny_run()
    ckpt = run / "checkpoints" / "iter_000001"
    weights = (ckpt / "model.safetensors").read_bytes()
    damaged = bytearray(weights)
    damaged[-16:-8] = b"\x00\x00\xc0\x7f" * 2  # two float32 NaNs over the last weights
    (ckpt / "model.safetensors").write_bytes(bytes(damaged))
    assert cli([str(run), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m dear.export: error: ") and "model.safetensors: damaged" in err and not (tmp_path / "out").exists()  # checked, not re-stamped
    (ckpt / "checksums.json").unlink()  # a checkpoint from before checksums: the NaN itself is caught
    with pytest.raises(ExportError, match=r"model\.safetensors: non-finite values"):
        export_checkpoint(run, tmp_path / "out")
    (ckpt / "model.safetensors").write_bytes(weights)
    (ckpt / "config.yaml").write_text("env: [unclosed")
    with pytest.raises(ExportError, match=r"config\.yaml: cannot be parsed"):
        export_checkpoint(run, tmp_path / "out")
    (run / "config.yaml").replace(ckpt / "config.yaml")  # the run's copy is the same config

    out = tmp_path / "out"
    assert main([str(run), str(out)]) == 0
    first = (out / "manifest.json").read_text()
    assert cli([str(run), str(out)]) == 2  # non-empty: refused, nothing overwritten
    assert "not empty" in capsys.readouterr().err and (out / "manifest.json").read_text() == first
    assert main([str(run), str(out), "--force"]) == 0
    load_exported(out)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ExportError, match="not a directory"):
        export_checkpoint(run, tmp_path / "afile")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_checkpoint(run, empty) == empty  # an existing empty directory is fine (eval uses a temp dir)


def test_manifest_without_checksum_or_unparsable_is_named(tmp_path):
    out = export_policy(JointPolicy(PolicyConfig(n_agents=3)), tmp_path / "e", encoder="hashing")
    m = json.loads((out / "manifest.json").read_text())
    del m["weights_sha256"]
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ExportError, match=r"manifest\.json: has no weights_sha256"):
        load_exported(out)
    (out / "manifest.json").write_text(json.dumps(m)[:50])
    with pytest.raises(ExportError, match=r"manifest\.json: export manifest cannot be parsed"):
        load_exported(out)


def test_the_committed_sim_trained_policy_loads_under_the_new_names(tmp_path):
    """Its manifest was converted once (temp_range -> temperature_range, training.rounds -> n_rounds; the weights
    and their sha256 unchanged); a manifest with an old key is refused, naming the key."""
    import shutil

    src = ROOT / "results" / "embedded-gsm8k-math500" / "policy"
    ex = load_exported(src)
    assert ex.policy.config.temperature_range == (0.1, 1.2) and ex.n_rounds == 2
    art = shutil.copytree(src, tmp_path / "old")
    m = json.loads((art / "manifest.json").read_text())
    m["policy_config"]["temp_range"] = m["policy_config"].pop("temperature_range")
    (art / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ExportError, match=r"bad policy_config: PolicyConfig: unknown keys \['temp_range'\]"):
        load_exported(art)


def test_new_manifests_use_the_new_names(tmp_path):
    out = export_policy(JointPolicy(PolicyConfig(n_agents=3)), tmp_path / "e", encoder="hashing",
                        training={"n_rounds": 3})
    m = json.loads((out / "manifest.json").read_text())
    assert "temperature_range" in m["policy_config"] and "temp_range" not in m["policy_config"]
    assert "log_std_init" in m["policy_config"] and load_exported(out).n_rounds == 3
