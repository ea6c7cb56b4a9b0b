"""Trainer on the sim backend: run dir + logs, exact resume, NaN stop, synthetic labelling, Ray restart."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from train.checkpoint import latest_checkpoint
from train.config import ConfigError, load_config
from train.happo import main
from train.runner import Trainer, TrainingError

SMALL = ["run.out_dir={out}", "logging.progress=false", "rollout.num_workers=0", "rollout.envs_per_worker=8", "rollout.group_size=1",
         "rollout.episodes_per_iter=16", "run.checkpoint_every=1", "happo.num_minibatches=2"]


def _cfg(tmp_path, *extra):
    return load_config("sim-stylised", [s.format(out=tmp_path) for s in SMALL] + list(extra))


def _rows(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k == "time" or "/time/" in k or "SPS" in k)} for r in rows]


def _weights(run_dir):
    return load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))


def test_resume_matches_uninterrupted_bit_for_bit(tmp_path):
    full = Trainer(_cfg(tmp_path / "a", "run.iterations=3"), run_dir=tmp_path / "a")
    full.train()
    full.close()

    part = Trainer(_cfg(tmp_path / "b", "run.iterations=1"), run_dir=tmp_path / "b")
    part.train()
    part.close()
    # continue the interrupted run through the CLI, extending it to 3 iterations
    assert main(["--resume", str(tmp_path / "b"), "run.iterations=3", "logging.progress=false"]) == 0

    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    oa = torch.load(latest_checkpoint(tmp_path / "a") / "optimizer.pt", weights_only=True)
    ob = torch.load(latest_checkpoint(tmp_path / "b") / "optimizer.pt", weights_only=True)
    for agent in oa:
        for pid, st in oa[agent]["state"].items():
            assert torch.equal(st["exp_avg_sq"], ob[agent]["state"][pid]["exp_avg_sq"])
    ra, rb = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert [r["iteration"] for r in rb] == [1, 2, 3]
    assert ra == rb  # every logged scalar identical (timings excluded)


def test_run_dir_logs_and_synthetic_labels(tmp_path):
    tr = Trainer(_cfg(tmp_path, "run.iterations=2", "run.name=lab"))
    res = tr.train()
    tr.close()
    run = res.run_dir
    assert "synthetic" in run.name
    assert (run / "config.yaml").exists() and (run / "metrics.csv").exists()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["synthetic"] is True for r in rows)
    keys = [k for k in rows[0] if k not in ("iteration", "global_step", "time", "synthetic")]
    assert keys and all(k.startswith("synthetic/") for k in keys)
    for k in ("losses/selection/policy_loss", "losses/behavior/approx_kl", "losses/value_loss",
              "losses/explained_variance", "charts/SPS", "rollout/accuracy", "rollout/hcr", "rollout/bcr",
              "rollout/tokens_per_question", "rollout/reward"):
        assert "synthetic/" + k in rows[0], k
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "synthetic/charts/SPS" in header
    summary = (run / "summary.json").read_text()
    assert summary == json.dumps(json.loads(summary), indent=2)  # the format runs were written in, no final newline
    ckpt = latest_checkpoint(run)
    assert ckpt.name == "iter_000002"
    for f in ("model.safetensors", "optimizer.pt", "state.json", "torch_rng.safetensors", "config.yaml"):
        assert (ckpt / f).exists(), f
    w = load_file(str(ckpt / "model.safetensors"))
    assert any(k.startswith("selection.") for k in w) and any(k.startswith("critic.") for k in w)
    assert "value_norm.mean" in w
    state = json.loads((ckpt / "state.json").read_text())
    assert state["counters"]["iteration"] == 2 and state["counters"]["global_step"] == 2 * 16 * 2


def test_nan_stops_with_clear_error_and_keeps_last_good_checkpoint(tmp_path):
    tr = Trainer(_cfg(tmp_path, "run.iterations=3"), run_dir=tmp_path / "run")
    real_collect = tr.pool.collect

    def poisoned(weights, chunks, on_chunk=None, on_result=None):
        report = real_collect(weights, chunks, on_chunk, on_result)
        if chunks[0].iteration == 1:
            report.results[0].batch.state[0, 0, 0] = math.nan
        return report

    tr.pool.collect = poisoned
    with pytest.raises(TrainingError, match=r"non-finite.*'state'.*last good checkpoint: .*iter_000001"):
        tr.train()
    tr.close()
    assert latest_checkpoint(tmp_path / "run").name == "iter_000001"


def test_sigint_checkpoints_the_last_finished_iteration(tmp_path):
    import os
    import signal

    tr = Trainer(_cfg(tmp_path, "run.iterations=5", "run.checkpoint_every=100"), run_dir=tmp_path / "run")
    real_collect = tr.pool.collect

    def interrupt_in_third(weights, chunks, on_chunk=None, on_result=None):
        if chunks[0].iteration == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real_collect(weights, chunks, on_chunk, on_result)

    tr.pool.collect = interrupt_in_third
    res = tr.train()
    tr.close()
    assert res.interrupted and res.iterations == 2
    assert latest_checkpoint(tmp_path / "run").name == "iter_000002"


@pytest.mark.timeout(600)
def test_ray_worker_restart_redoes_episodes(tmp_path):
    """Kill a Ray rollout worker; the pool recreates it, redoes its chunks with the same seeds (so the
    results equal an undisturbed collection) and counts the restart."""
    ray = pytest.importorskip("ray")
    from train.workers import RayPool, make_chunks

    cfg = _cfg(tmp_path, "rollout.num_workers=2", "rollout.worker_num_cpus=0.1")
    pool = RayPool(cfg)
    try:
        from train.build import make_policy

        weights = make_policy(cfg).state_dict()
        chunks = make_chunks(cfg, 0)
        ref = pool.collect(weights, chunks)
        assert ref.worker_restarts == 0
        old_pid = ray.get(pool.workers[0].pid.remote())
        ray.kill(pool.workers[0])
        progress = []
        rep = pool.collect(weights, chunks, on_chunk=lambda done, total: progress.append((done, total)))
        assert rep.worker_restarts == 1 and rep.episodes_redone == 8
        total = sum(len(c.env_seeds) for c in chunks)
        assert len(progress) == len(chunks) and progress[-1] == (total, total)  # one report per finished chunk
        assert [d for d, _ in progress] == sorted(d for d, _ in progress)
        assert ray.get(pool.workers[0].pid.remote()) != old_pid
        for a, b in zip(ref.results, rep.results):
            assert torch.equal(a.batch.rewards, b.batch.rewards)
            assert torch.equal(a.batch.pairs, b.batch.pairs)
    finally:
        pool.close()
        ray.shutdown()


@pytest.mark.timeout(600)
def test_ray_pool_with_a_shared_engine_matches_the_local_pool(tmp_path):
    """`llm.placement: engine`: the TrainConfig goes to the engine actor and each worker as is (no dict round
    trip); the workers built by train.build collect exactly what the in-process pool collects."""
    pytest.importorskip("ray")
    cfg = _cfg(tmp_path, "rollout.num_workers=2", "rollout.worker_num_cpus=0.1", "llm.placement=engine")
    want, got = _local_and_ray_rollouts(cfg, lambda pool: len(pool.engines) == 1 and pool.synthetic)
    _assert_same_rollouts(want, got)


def _local_and_ray_rollouts(cfg, check_pool):
    """The first iteration's chunks collected in-process and by a RayPool; `check_pool(pool)` must hold."""
    import ray

    from train.build import make_policy
    from train.workers import LocalPool, RayPool, make_chunks

    weights, chunks = make_policy(cfg).state_dict(), make_chunks(cfg, 0)
    local = LocalPool(cfg)
    try:
        want = local.collect(weights, chunks)
    finally:
        local.close()
    pool = RayPool(cfg)
    try:
        assert check_pool(pool)
        got = pool.collect(weights, chunks)
    finally:
        pool.close()
        ray.shutdown()
    return want, got


def _assert_same_rollouts(want, got):
    assert len(want.results) == len(got.results) > 0
    for a, b in zip(want.results, got.results):
        assert torch.equal(a.batch.rewards, b.batch.rewards) and torch.equal(a.batch.pairs, b.batch.pairs)
        assert [e.question_id for e in a.episodes] == [e.question_id for e in b.episodes]


@pytest.mark.timeout(600)
def test_ray_pool_places_one_engine_per_gpu_and_binds_workers_round_robin(tmp_path):
    """`rollout.num_engines: 2`, `rollout.engine_num_gpus: 1` on a Ray node declaring 2 GPUs: Ray gives each
    engine its own GPU (CUDA_VISIBLE_DEVICES "0" and "1"), worker i talks to engine i % 2, and the rollouts are
    the in-process pool's. Ray's GPU bookkeeping is real; the GPUs are declared, since this machine has none."""
    ray = pytest.importorskip("ray")
    from train.workers import engine_num_gpus

    cfg = _cfg(tmp_path, "rollout.num_workers=2", "rollout.worker_num_cpus=0.1", "rollout.engine_num_cpus=0.1",
               "llm.placement=engine", "rollout.num_engines=2", "rollout.engine_num_gpus=1")
    assert engine_num_gpus(cfg) == 1.0
    assert engine_num_gpus(_cfg(tmp_path)) == 0.0  # sim backend, no setting: no GPU
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="warning")

    def one_engine_per_gpu(pool) -> bool:
        devices = [i["cuda_visible_devices"] for i in pool.engine_info]
        bound = [ray.get(w.engine.remote())["cuda_visible_devices"] for w in pool.workers]
        return sorted(devices) == ["0", "1"] and bound == devices  # worker i -> engine i % 2

    want, got = _local_and_ray_rollouts(cfg, one_engine_per_gpu)
    _assert_same_rollouts(want, got)


def test_engine_gpus_default_to_vllm_tensor_parallel_size(tmp_path):
    from train.workers import engine_num_gpus

    assert engine_num_gpus(_cfg(tmp_path, "llm.spec=vllm:Qwen/Qwen3-8B")) == 1.0
    assert engine_num_gpus(_cfg(tmp_path, "llm.spec=vllm:Qwen/Qwen3-8B", "llm.options.tensor_parallel_size=4")) == 4.0
    assert engine_num_gpus(_cfg(tmp_path, "llm.spec=vllm:Qwen/Qwen3-8B", "rollout.engine_num_gpus=0.5")) == 0.5
    with pytest.raises(ConfigError, match="rollout.num_engines"):
        _cfg(tmp_path, "rollout.num_engines=0")
    with pytest.raises(ConfigError, match="rollout.engine_num_gpus"):
        _cfg(tmp_path, "rollout.engine_num_gpus=-1")


def test_wandb_offline_logs_the_same_scalars(tmp_path, monkeypatch):
    """wandb is optional; when installed and enabled it works with no network (WANDB_MODE=offline) and gets
    the same scalars as the CSV/JSONL."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tr = Trainer(_cfg(tmp_path, "run.iterations=2", "logging.wandb=true"), run_dir=tmp_path / "run")
    run, sent = tr.logger._wandb, []
    real_log = run.log
    monkeypatch.setattr(run, "log", lambda data, step=None: (sent.append((step, data)), real_log(data, step=step)))
    tr.train()
    tr.close()
    offline = list((tmp_path / "run" / "wandb").glob("offline-run-*/*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0, "no offline wandb run was written"
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [step for step, _ in sent] == [r["global_step"] for r in rows]
    key = "synthetic/losses/value_loss"  # the sim run's scalars carry the synthetic prefix everywhere
    assert [data[key] for _, data in sent] == [r[key] for r in rows]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_address_joins_an_existing_cluster(tmp_path):
    """`--ray-address` joins a cluster started outside the trainer (`ray start --head`) instead of starting one."""
    import os
    import socket
    import subprocess
    import sys

    pytest.importorskip("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run([ray_bin, "start", "--head", "--num-cpus", "2", "--include-dashboard", "false",
                    "--port", str(port)], env=env, check=True, capture_output=True, timeout=120)
    try:
        r = subprocess.run([sys.executable, "-m", "train.happo", "--config", "sim-stylised", "run.iterations=1",
                            "rollout.num_workers=2", "rollout.envs_per_worker=16", "rollout.episodes_per_iter=32",
                            "logging.progress=false",
                            f"run.out_dir={tmp_path}", "--ray-address", f"127.0.0.1:{port}"],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        out = r.stdout + r.stderr  # Ray reports the cluster it joined (by the node's IP, on our port)
        assert "existing Ray cluster" in out and f":{port}" in out
        assert list(tmp_path.glob("*/checkpoints/iter_000001/model.safetensors"))
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
