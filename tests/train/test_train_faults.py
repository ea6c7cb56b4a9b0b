"""Faults lose nothing in training: failed requests, dead backends, reused run directories, failed
resumes, interrupted iterations and damaged checkpoint files. All on the real sim backend with its seeded fault
injection (`llm.options.fail_rate`), so the counts are deterministic."""

import hashlib
import json
import os
import signal

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dear.cli import exit_code
from dear.llm.base import ChatMessage, ChatRequest
from dear.sim import SimBackend
from dear.tasks import load as load_task
from train.checkpoint import CheckpointError, latest_checkpoint
from train.config import ConfigError, load_config
from train.happo import CODES, ERRORS, PROG, main
from train.partial import PARTIAL_DIR
from train.runner import RunDirError, Trainer

SMALL = ["logging.progress=false", "rollout.num_workers=0", "rollout.envs_per_worker=8", "rollout.group_size=1",
         "rollout.episodes_per_iter=16", "run.checkpoint_every=1", "happo.num_minibatches=2"]


def cli(argv: list[str]) -> int:
    """The exit code of `python -m train.happo ARGV`, its error line on stderr (dear.cli.run without exiting)."""
    return exit_code(lambda: main(argv), PROG, errors=ERRORS, codes=CODES, argv=argv)


def _cfg(*extra):
    return load_config("sim-stylised", SMALL + list(extra))


def _rows(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k == "time" or "/time/" in k or "SPS" in k)} for r in rows]


def _tree(root):
    """path -> sha256 of every file under root (to show that nothing changed on disk)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _train(run_dir, *extra):
    tr = Trainer(_cfg(*extra), run_dir=run_dir)
    try:
        return tr.train()
    finally:
        tr.close()


# ------------------------------------------------------------------ 1. failed requests


def _requests(n):
    qs = load_task("synthetic", n=n, seed=0)
    return [ChatRequest((ChatMessage("user", q.question),), seed=k,
                        metadata={"question_text": q.question, "question_id": q.id, "agent": 0, "round": 0})
            for k, q in enumerate(qs)]


def test_sim_fault_injection_is_seeded_and_leaves_other_answers_alone():
    reqs = _requests(400)
    clean = SimBackend(seed=3).generate(reqs)
    faulty = SimBackend(seed=3, fail_rate=0.05).generate(reqs)
    again = SimBackend(seed=3, fail_rate=0.05).generate(list(reversed(reqs)))[::-1]
    failed = [c.error is not None for c in faulty]
    assert failed == [c.error is not None for c in again]  # deterministic, whatever the batch order
    assert 8 <= sum(failed) <= 35  # ~5 % of 400
    assert all(c.finish_reason == "error" and "injected failure" in c.error for c in faulty if c.error)
    assert all(f.text == c.text for f, c in zip(faulty, clean) if f.error is None)
    assert all(c.error for c in SimBackend(fail_rate=1.0).generate(reqs[:5]))
    with pytest.raises(ValueError, match="fail_rate"):
        SimBackend(fail_rate=1.5)


def test_vector_env_carries_failed_debates_along_while_the_others_finish():
    from gymnasium.vector import AutoresetMode

    from envs.vector_env import DebateVectorEnv

    venv = DebateVectorEnv(num_envs=8, llm=SimBackend(seed=0, fail_rate=0.06), n_agents=3, n_rounds=2,
                           autoreset_mode=AutoresetMode.DISABLED)
    venv.reset(seed=list(range(8)))
    act = {"mask": np.ones((8, 6), np.int8), "behavior": np.zeros((8, 6), np.float32)}
    _, r1, t1, _, i1 = venv.step(act)
    _, r2, t2, _, i2 = venv.step(act)
    failed = np.asarray(i2["failed"], bool)
    assert failed.any() and not failed.all()  # this seed fails some debates, not all
    assert t2.all()  # every debate has ended after 2 rounds
    early = np.asarray(i1["failed"], bool) & t1  # failed by the first exchange round: frozen in the second
    assert early.any() and (r2[early] == 0).all() and np.asarray(i2["_frozen"])[early].all()
    assert all(len(venv.debates[k].trace.rounds) == 3 for k in np.flatnonzero(~failed))
    with pytest.raises(RuntimeError, match="reset_mask"):  # finished (not failed) ones still wait for a reset
        venv.step(act)


def test_five_percent_failed_requests_over_three_iterations(tmp_path):
    """5 % of requests fail; training finishes, the failed debates are counted and left out."""
    res = _train(tmp_path / "run", "run.iterations=3", "llm.options.fail_rate=0.05")
    assert res.iterations == 3 and not res.interrupted
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    failed = [r["synthetic/rollout/failed_debates"] for r in rows]
    finished = [r["synthetic/rollout/episodes"] for r in rows]
    print("synthetic 5 % failure run, failed debates per iteration:", failed, "finished:", finished)
    assert failed == [4.0, 5.0, 7.0]  # deterministic: run.seed 1, sim seed 0, 16 debates/iteration
    assert all(f + n == 16 for f, n in zip(failed, finished))
    assert rows[-1]["synthetic/charts/failed_debates_total"] == sum(failed)
    # The update saw only the finished debates: env steps = 2 rounds x finished debates.
    assert [r["global_step"] for r in rows] == list(np.cumsum([2 * n for n in finished]))
    state = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())
    assert state["counters"]["failed_episodes"] == sum(failed)
    assert state["counters"]["episodes"] == sum(finished)


def test_all_failing_backend_stops_non_zero_without_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    code = cli(["--config", "sim-stylised", "--run-dir", str(run), *SMALL, "run.iterations=3",
                 "llm.options.fail_rate=1.0"])
    err = capsys.readouterr().err
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("python -m train.happo: error:")]
    assert len(errors) == 1 and "all 16 debates failed on backend 'sim'" in errors[0]
    assert "no update" in errors[0] and "injected failure" in errors[0]
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()


# ------------------------------------------------------------------ 4. run directories


def test_existing_run_dir_refuses_without_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    _train(run, "run.iterations=3")
    before = _tree(run)
    assert cli(["--config", "sim-stylised", "--run-dir", str(run), *SMALL, "run.iterations=1"]) == 2
    assert "already holds a run" in capsys.readouterr().err and _tree(run) == before
    with pytest.raises(RunDirError, match="--overwrite"):
        Trainer(_cfg("run.iterations=1"), run_dir=run)
    assert _tree(run) == before
    (run / "notes.txt").write_text("mine")  # not a run artifact: --overwrite keeps it
    assert cli(["--config", "sim-stylised", "--run-dir", str(run), "--overwrite", *SMALL, "run.iterations=1"]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000001", "latest"]  # no stale iter_3
    assert len(_rows(run)) == 1 and (run / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="not a directory"):
        Trainer(_cfg(), run_dir=tmp_path / "file")


def test_failed_resume_changes_nothing_on_disk(tmp_path, capsys):
    run = tmp_path / "run"
    _train(run, "run.iterations=2")
    before = _tree(run)
    assert cli(["--resume", str(run), "env.n_agents=5", "logging.progress=false"]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "do not fit" in err
    assert _tree(run) == before  # config.yaml, metrics and checkpoints untouched
    assert cli(["--resume", str(run), "run.iterations=3", "logging.progress=false"]) == 0  # still resumable


def test_cli_rejects_config_with_resume_and_bad_episode_counts(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["--config", "sim-stylised", "--resume", str(tmp_path)])
    assert e.value.code == 2 and "--config cannot be combined with --resume" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["--resume", str(tmp_path), "--run-dir", str(tmp_path / "x")])
    with pytest.raises(ConfigError, match=r"rollout\.episodes_per_iter.*multiple of rollout\.envs_per_worker=64"):
        load_config("sim-stylised", ["rollout.episodes_per_iter=5"])
    assert cli(["--config", "sim-stylised", "--run-dir", str(tmp_path / "r"), "rollout.episodes_per_iter=5"]) == 2
    assert "rollout.episodes_per_iter" in capsys.readouterr().err and not (tmp_path / "r").exists()


# ------------------------------------------------------------------ 5. interrupted iterations


def test_interrupted_iteration_keeps_finished_chunks_and_resume_is_bit_identical(tmp_path, capsys):
    """SIGINT after 2 of the 4 chunks of iteration 2: the 2 chunks are kept on disk, --resume reuses them
    (no recollection) and the run ends bit-identical to an uninterrupted one (weights, optimiser, metrics)."""
    extra = ["run.iterations=3", "rollout.envs_per_worker=4", "rollout.group_size=1", "run.checkpoint_every=100"]
    _train(tmp_path / "a", *extra)

    tr = Trainer(_cfg(*extra), run_dir=tmp_path / "b")
    real_collect = tr.pool.collect
    saved = []

    def collect(weights, chunks, on_chunk=None, on_result=None):
        def keep_then_stop(result):
            on_result(result)
            saved.append(result.spec)
            if result.spec.iteration == 1 and len([s for s in saved if s.iteration == 1]) == 2:
                os.kill(os.getpid(), signal.SIGINT)  # a real signal through the trainer's handler

        return real_collect(weights, chunks, on_chunk, keep_then_stop)

    tr.pool.collect = collect
    res = tr.train()
    tr.close()
    assert res.interrupted and res.iterations == 1
    kept = sorted(p.name for p in (tmp_path / "b" / PARTIAL_DIR / "iter_000001").iterdir())
    assert kept == ["chunk_0000.pt", "chunk_0001.pt"]
    assert latest_checkpoint(tmp_path / "b").name == "iter_000001"
    capsys.readouterr()

    assert cli(["--resume", str(tmp_path / "b"), "logging.progress=false"]) == 0
    assert "reusing 8 finished debates (2 chunks)" in capsys.readouterr().out
    assert not (tmp_path / "b" / PARTIAL_DIR).exists()  # cleared once the iteration's update was done
    wa = load_file(str(latest_checkpoint(tmp_path / "a") / "model.safetensors"))
    wb = load_file(str(latest_checkpoint(tmp_path / "b") / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    oa = torch.load(latest_checkpoint(tmp_path / "a") / "optimizer.pt", weights_only=True)
    ob = torch.load(latest_checkpoint(tmp_path / "b") / "optimizer.pt", weights_only=True)
    for agent in oa:
        for pid, st in oa[agent]["state"].items():
            assert torch.equal(st["exp_avg"], ob[agent]["state"][pid]["exp_avg"])
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b")


def test_kept_chunks_are_reused_only_for_the_same_weights_and_skip_failed_debates(tmp_path):
    from train.partial import PartialIteration, rollout_key
    from train.build import make_policy
    from train.workers import LocalPool, make_chunks

    cfg = _cfg("rollout.envs_per_worker=4", "rollout.group_size=1", "llm.options.fail_rate=0.05")
    weights = make_policy(cfg).state_dict()
    chunks = make_chunks(cfg, 0)
    pool = LocalPool(cfg)
    try:
        part = PartialIteration(tmp_path, 0, rollout_key(cfg, weights))
        report = pool.collect(weights, chunks, on_result=part.save)
    finally:
        pool.close()
    clean = [r.spec.index for r in report.results if not any(e.failed for e in r.episodes)]
    assert 0 < len(clean) < len(chunks)  # this seed has chunks with and without a failed debate
    loaded = part.load(chunks)
    assert sorted(loaded) == clean  # chunks with a failed debate are collected again after a stop
    for i in clean:
        assert torch.equal(loaded[i].batch.rewards, report.results[i].batch.rewards)
        assert loaded[i].episodes == report.results[i].episodes
    other = {k: v + 1e-3 if v.is_floating_point() else v for k, v in weights.items()}
    assert PartialIteration(tmp_path, 0, rollout_key(cfg, other)).load(chunks) == {}
    (part.path / f"chunk_{clean[0]:04d}.pt").write_bytes(b"truncated")
    assert clean[0] not in part.load(chunks)  # damaged: named in a warning and collected again


# ------------------------------------------------------------------ 6. verified checkpoint files


def _damage(path, offset=200):
    data = bytearray(path.read_bytes())
    data[offset:offset + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))


def test_damaged_checkpoint_files_are_named(tmp_path, capsys):
    run = tmp_path / "run"
    _train(run, "run.iterations=1")
    ckpt = latest_checkpoint(run)
    assert set(json.loads((ckpt / "checksums.json").read_text())["files"]) == {
        "model.safetensors", "optimizer.pt", "torch_rng.safetensors", "state.json", "config.yaml"}
    original = {p.name: p.read_bytes() for p in ckpt.iterdir()}

    def restore():
        for name, data in original.items():
            (ckpt / name).write_bytes(data)

    for name in ("model.safetensors", "optimizer.pt", "state.json"):
        _damage(ckpt / name, offset=min(200, len(original[name]) // 2))
        with pytest.raises(CheckpointError, match=rf"{name}: damaged"):
            Trainer(_cfg("run.iterations=2"), run_dir=run, resume=True)
        restore()
    # Without checksums (a checkpoint from before them): unparsable files are still named.
    (ckpt / "checksums.json").unlink()
    (ckpt / "state.json").write_text(original["state.json"].decode()[:40])
    with pytest.raises(CheckpointError, match=r"state\.json: checkpoint state cannot be parsed"):
        Trainer(_cfg("run.iterations=2"), run_dir=run, resume=True)
    restore()
    (ckpt / "checksums.json").unlink()
    (ckpt / "optimizer.pt").write_bytes(original["optimizer.pt"][:100])
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: optimizer state cannot be read"):
        Trainer(_cfg("run.iterations=2"), run_dir=run, resume=True)
    restore()
    (run / "checkpoints" / "latest").write_text("iter_000009")
    assert cli(["--resume", str(run), "logging.progress=false"]) == 2
    assert "latest: names 'iter_000009'" in capsys.readouterr().err


def test_damaged_metrics_log_is_named_and_a_torn_last_row_is_dropped(tmp_path, capsys):
    run = tmp_path / "run"
    _train(run, "run.iterations=2")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(lines[0][:30] + "\n" + lines[1] + "\n")
    before = _tree(run)
    assert cli(["--resume", str(run), "run.iterations=3", "logging.progress=false"]) == 2
    assert "metrics.jsonl:1: not a metrics row" in capsys.readouterr().err and _tree(run) == before
    (run / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1][:40])  # a crash in the middle of a write
    assert cli(["--resume", str(run), "run.iterations=3", "logging.progress=false"]) == 0
    assert "incomplete last row dropped" in capsys.readouterr().out
    assert [r["iteration"] for r in _rows(run)] == [1, 3]  # row 2 was lost with the torn write; 3 is new


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_interrupted_ray_iteration_resumes_to_the_uninterrupted_local_run(tmp_path, capsys):
    """The same stop on real Ray rollout actors (2 workers): finished chunks arrive out of order, are kept, and
    the resumed run equals an uninterrupted in-process run bit for bit (chunks depend only on their seeds)."""
    ray = pytest.importorskip("ray")
    extra = ["run.iterations=3", "rollout.envs_per_worker=4", "rollout.group_size=1", "run.checkpoint_every=100"]
    _train(tmp_path / "local", *extra)
    ray_extra = [*extra, "rollout.num_workers=2", "rollout.worker_num_cpus=0.1"]
    try:
        tr = Trainer(_cfg(*ray_extra), run_dir=tmp_path / "ray")
        real_collect = tr.pool.collect
        seen = []

        def collect(weights, chunks, on_chunk=None, on_result=None):
            def keep_then_stop(result):
                on_result(result)
                seen.append(result.spec.iteration)
                if seen.count(1) == 2:
                    os.kill(os.getpid(), signal.SIGINT)

            return real_collect(weights, chunks, on_chunk, keep_then_stop)

        tr.pool.collect = collect
        res = tr.train()
        tr.close()
        assert res.interrupted and res.iterations == 1
        assert len(list((tmp_path / "ray" / PARTIAL_DIR / "iter_000001").glob("chunk_*.pt"))) == 2
        capsys.readouterr()
        assert cli(["--resume", str(tmp_path / "ray"), "logging.progress=false"]) == 0
        assert "reusing 8 finished debates (2 chunks)" in capsys.readouterr().out
    finally:
        ray.shutdown()
    wa = load_file(str(latest_checkpoint(tmp_path / "local") / "model.safetensors"))
    wb = load_file(str(latest_checkpoint(tmp_path / "ray") / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    drop = ("charts/worker_restarts", "charts/episodes_redone", "llm_share")
    ra = [{k: v for k, v in r.items() if not any(d in k for d in drop)} for r in _rows(tmp_path / "local")]
    rb = [{k: v for k, v in r.items() if not any(d in k for d in drop)} for r in _rows(tmp_path / "ray")]
    assert ra == rb


def test_unreachable_openai_backend_is_one_error_line_at_start(tmp_path, capsys):
    run = tmp_path / "run"
    code = cli(["--config", "sim-stylised", "--run-dir", str(run), *SMALL, "llm.spec=openai:http://127.0.0.1:9/v1",
                 "llm.options={}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and "connection refused" in err
    assert not run.exists()  # nothing was written for a run that could not start
