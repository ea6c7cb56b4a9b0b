"""Ctrl-C keeps what finished (issue 59 item 2), on the sim backend: a stop in the middle of a chunk keeps the
iteration's finished chunks and the model calls that had returned in the chunk still running; the last lines say
what was kept and give the exact `--resume` command; `--resume` replays the logged calls instead of generating them
and ends bit-identical to an uninterrupted run. A stop before anything finished says so plainly. The llama.cpp
thread count of a local/smoke run is fixed at its start, recorded in config.yaml and reused by `--resume`."""

from __future__ import annotations

import json

import pytest
import yaml

import train.workers
from dear.cli import exit_code
from train.build import make_local_backend, settle_threads
from train.call_log import read_call_log
from train.config import config_from_dict, load_config
from train.happo import CODES, ERRORS, PROG, main
from train.partial import PARTIAL_DIR

# 2 iterations of 2 chunks of 4 debates, R = 2: each chunk makes 3 batched backend calls (rounds 0, 1, 2)
ARGS = ["logging.progress=false", "rollout.num_workers=0", "rollout.envs_per_worker=4", "rollout.group_size=1",
        "rollout.episodes_per_iter=8", "run.iterations=2", "run.checkpoint_every=100", "happo.num_minibatches=2"]
CALLS_PER_CHUNK = 3


class Counting:
    """The sim backend, counting its batched calls and requests; raises KeyboardInterrupt (what the trainer's
    SIGINT handler raises) when call number `stop_at` comes in."""

    def __init__(self, inner, state):
        self.inner, self.state = inner, state
        self.model_id, self.synthetic, self.context_length = inner.model_id, inner.synthetic, inner.context_length

    def generate(self, requests):
        self.state["calls"] += 1
        if self.state["calls"] == self.state.get("stop_at"):
            raise KeyboardInterrupt
        self.state["requests"] += len(requests)
        return self.inner.generate(requests)

    def count_tokens(self, text):
        return self.inner.count_tokens(text)

    def serves(self, task, question_id):
        return self.inner.serves(task, question_id)

    def close(self):
        self.inner.close()


@pytest.fixture
def backend_calls(monkeypatch):
    state = {"calls": 0, "requests": 0}
    real = train.workers.make_local_backend
    monkeypatch.setattr(train.workers, "make_local_backend", lambda cfg: Counting(real(cfg), state))

    def reset(stop_at=None):
        state.update(calls=0, requests=0, stop_at=stop_at)
        return state

    return reset


def cli(argv):
    return exit_code(lambda: main(argv), PROG, errors=ERRORS, codes=CODES, argv=argv)


def _rows(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k == "time" or "time/" in k or "SPS" in k)} for r in rows]


def test_a_stop_inside_a_chunk_keeps_its_returned_calls_and_resume_replays_them(tmp_path, capsys, backend_calls):
    whole = backend_calls()
    assert cli(["--config", "sim-stylised", "--run-dir", str(tmp_path / "a"), *ARGS]) == 0
    assert whole["calls"] == 4 * CALLS_PER_CHUNK
    requests_per_call = whole["requests"] // whole["calls"]

    # Stop at round 1 of iteration 2's second chunk: its first chunk finished, its round 0 returned.
    stop_at = 3 * CALLS_PER_CHUNK + 2
    backend_calls(stop_at=stop_at)
    run = tmp_path / "b"
    capsys.readouterr()
    assert cli(["--config", "sim-stylised", "--run-dir", str(run), *ARGS]) == 130
    out = capsys.readouterr().out
    partial = run / PARTIAL_DIR / "iter_000001"
    assert sorted(p.name for p in partial.iterdir()) == ["chunk_0000.pt", "chunk_0001.calls.jsonl"]
    key = json.loads((partial / "chunk_0001.calls.jsonl").read_text().splitlines()[0])["rollout_key"]
    logged = read_call_log(partial / "chunk_0001.calls.jsonl", key)
    assert sum(len(v) for v in logged.values()) == requests_per_call  # round 0 of the running chunk
    lines = out.splitlines()
    assert any(f"kept of iteration 2: 4 finished debates (1 chunk) and {requests_per_call} model calls" in x
               and "of its unfinished debates" in x and str(partial) in x for x in lines), out
    assert lines[-1] == f"[synthetic] continue with: python -m train.happo --resume {run}"

    resumed = backend_calls()
    assert cli(["--resume", str(run), "logging.progress=false"]) == 0
    out = capsys.readouterr().out
    assert (f"resuming {run} from iteration 1/2 (4 finished debates kept, {requests_per_call} model calls of "
            f"unfinished ones replayed)") in out
    # only rounds 1 and 2 of the second chunk were generated; round 0 came from the log
    assert resumed["calls"] == CALLS_PER_CHUNK - 1
    assert not (run / PARTIAL_DIR).exists()
    assert _rows(tmp_path / "a") == _rows(run)  # the same run as the uninterrupted one


def test_a_stop_before_anything_finished_says_so_and_gives_the_command(tmp_path, capsys, backend_calls):
    backend_calls(stop_at=1)
    run = tmp_path / "run"
    assert cli(["--config", "sim-stylised", "--run-dir", str(run), *ARGS]) == 130
    lines = capsys.readouterr().out.splitlines()
    assert ("[synthetic] stopped before any debate of iteration 1 finished and before any of its model calls "
            "returned: nothing of iteration 1 was kept; --resume starts it again") in lines
    assert lines[-1] == f"[synthetic] continue with: python -m train.happo --resume {run}"
    assert cli(["--resume", str(run), "logging.progress=false"]) == 0
    assert f"resuming {run} from iteration 0/2 (0 finished debates kept)" in capsys.readouterr().out


def test_a_logged_call_under_other_weights_is_not_replayed(tmp_path):
    from dear.llm.base import ChatMessage, ChatRequest
    from dear.sim import SimBackend
    from train.call_log import CallLog, CallLogSpec

    spec = CallLogSpec(directory=str(tmp_path), key="k1", host=__import__("os").uname().nodename)
    request = ChatRequest((ChatMessage("user", "[synthetic id=x difficulty=0.50 answer=7 distractors=8] q"),), seed=3)
    log = CallLog(SimBackend())
    log.begin(spec, 0)
    first = log.generate([request, request])
    log.end()
    assert sum(len(v) for v in read_call_log(spec.file(0), "k1").values()) == 2
    log.begin(spec, 0)
    assert log.generate([request, request]) == first and log.replayed == 2  # identical requests in their order
    log.end()
    log.begin(CallLogSpec(spec.directory, "k2", spec.host), 0)  # another rollout key: the log is not used
    log.generate([request])
    assert log.replayed == 2
    log.close()


# ------------------------------------------------------------------ llama.cpp threads (issue 59 item 4)


def test_a_llama_run_records_its_thread_count_and_resume_reuses_it(monkeypatch):
    import dear.llm.registry
    import os

    monkeypatch.delenv("DEAR_LLAMA_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.7, 1.7, 1.7), raising=False)  # busy: still every core
    cfg = load_config("smoke")
    assert cfg.llm.threads is None
    note = settle_threads(cfg)
    assert cfg.llm.threads == 2 and "recorded as llm.threads" in note
    saved = yaml.safe_load(yaml.safe_dump(cfg.to_dict()))
    assert saved["llm"]["threads"] == 2
    seen = {}
    monkeypatch.setattr(dear.llm.registry, "make_backend", lambda spec, **kw: seen.update(kw) or object())
    make_local_backend(cfg)
    assert seen["n_threads"] == 2

    # --resume on a machine where DEAR_LLAMA_THREADS now says 1: the run keeps the count it started with
    monkeypatch.setenv("DEAR_LLAMA_THREADS", "1")
    resumed = config_from_dict(saved)
    note = settle_threads(resumed, resumed=True)
    assert resumed.llm.threads == 2 and "DEAR_LLAMA_THREADS=1 is not used" in note
    # a run started with DEAR_LLAMA_THREADS records that count; the sim backend has none
    fresh = load_config("smoke")
    settle_threads(fresh)
    assert fresh.llm.threads == 1
    sim = load_config("sim-stylised")
    assert settle_threads(sim) is None and sim.llm.threads is None
