"""`python -m dear.serve` as a real process on 127.0.0.1, spoken to with the official `openai` client.

The served policy is exported from a short HAPPO run on the synthetic debaters (`sim`), like a user's would
be. Backends: `sim` (synthetic; concurrency and the request contract), the latency-simulating stand-in server
`bench/latency_server.py` through the `openai:` backend (streaming timing, backend down and back), and the
smoke GGUF model through llama.cpp (a real-model round trip).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")  # the dev extra installs it; without it these tests cannot run

from dear.debate.methods import SERVED  # noqa: E402
from dear.tasks.synthetic import load_synthetic  # noqa: E402
from tests import ROOT  # noqa: E402

# The servers' environment: no API key unless a test sets one, and one llama.cpp thread (the machine is shared).
ENV = {**{k: v for k, v in os.environ.items() if k != "DEAR_API_KEY"}, "PYTHONPATH": str(ROOT),
       "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "DEAR_LLAMA_THREADS": os.environ.get("DEAR_LLAMA_THREADS", "1")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A server subprocess with its log file; `wait_ready` polls a URL until it answers."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None):
        self.log_path = log
        self._log = open(log, "w")
        self.proc = subprocess.Popen(args, cwd=ROOT, env={**ENV, **(env or {})}, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, url: str, ok=(200,), timeout: float = 180) -> httpx.Response:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                r = httpx.get(url, timeout=5)
                if r.status_code in ok:
                    return r
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{url} not ready after {timeout} s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@contextmanager
def dear_server(policy: Path, llm: str, tmp: Path, *extra: str, health_ok=(200,),
                env: dict[str, str] | None = None):
    port = free_port()
    proc = Proc([sys.executable, "-m", "dear.serve", "--policy", str(policy), "--llm", llm, "--port", str(port),
                 "--log-level", "warning", *extra], tmp / f"serve-{port}.log", env)
    try:
        proc.wait_ready(f"http://127.0.0.1:{port}/health", ok=health_ok)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


@contextmanager
def latency_server(port: int, tmp: Path, ms_per_token: float = 5.0, tokens: int = 64):
    proc = Proc([sys.executable, str(ROOT / "bench" / "latency_server.py"), "--port", str(port),
                 "--ms-per-token", str(ms_per_token), "--tokens", str(tokens)], tmp / f"latency-{port}.log")
    try:
        proc.wait_ready(f"http://127.0.0.1:{port}/v1/models", timeout=60)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.stop()


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def export_sim_policy(tmp: Path) -> Path:
    """A policy exported from a one-iteration HAPPO run on the synthetic debaters (in `tmp`)."""
    from dear.export import export_checkpoint
    from train.config import load_config
    from train.runner import Trainer

    cfg = load_config("sim-stylised", [f"run.out_dir={tmp}", "logging.progress=false", "rollout.num_workers=0",
                              "rollout.envs_per_worker=8", "rollout.group_size=1", "rollout.episodes_per_iter=8", "run.iterations=1"])
    trainer = Trainer(cfg, run_dir=tmp / "run")
    trainer.train()
    trainer.close()
    return export_checkpoint(tmp / "run", tmp / "policy")


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    return export_sim_policy(tmp_path_factory.mktemp("sim-run"))


@pytest.fixture(scope="module")
def sim_server(policy, tmp_path_factory):
    with dear_server(policy, "sim", tmp_path_factory.mktemp("sim-serve"), "--batch-window-ms", "50",
                     "--max-active", "64") as base:
        yield base


def synthetic_questions(n: int, seed: int = 0) -> list[str]:
    return [q.question for q in load_synthetic(n=n, seed=seed, split="test")]


def ask(c: openai.OpenAI, question: str, **kw):
    return c.chat.completions.create(model=kw.pop("model", "dear"),
                                     messages=[{"role": "user", "content": question}], **kw)


def check_debate(r, rounds: int = 2, n_agents: int = 3) -> dict:
    """The response's extension field agrees with itself: vote, rounds, masks, peers and token totals."""
    dear = r.model_extra["dear"]
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == (dear["answer"] or "")
    assert [x["round"] for x in dear["rounds"]] == list(range(rounds + 1))
    last = [a["key"] for a in dear["rounds"][-1]["agents"]]
    if dear["answer"] is not None:
        assert dear["votes"][dear["answer"]] == max(dear["votes"].values()) and dear["answer"] in last
    for rnd in dear["rounds"]:
        assert len(rnd["agents"]) == n_agents
        if rnd["round"] == 0:
            assert "regulator" not in rnd and all(a["peers"] == [] for a in rnd["agents"])
        else:
            reg = rnd["regulator"]
            assert [a["peers"] for a in rnd["agents"]] == [[j for j, m in enumerate(row) if m] for row in reg["mask"]]
            assert [a["temperature"] for a in rnd["agents"]] == pytest.approx(reg["temperature"])
    prompt = sum(a["prompt_tokens"] for rnd in dear["rounds"] for a in rnd["agents"])
    completion = sum(a["completion_tokens"] for rnd in dear["rounds"] for a in rnd["agents"])
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (prompt, completion) and completion > 0
    assert r.usage.total_tokens == prompt + completion
    return dear


# ---------------------------------------------------------------------------------------------------
# sim backend: the contract


def test_health_models_and_a_round_trip(sim_server):
    health = httpx.get(f"{sim_server}/health").json()
    assert health["status"] == "ok" and health["backend"] == {"model_id": "sim-v1", "synthetic": True, "agent_profiles": None}
    assert health["policy"]["trained_on_synthetic"] is True and health["policy"]["n_rounds"] == 2
    c = client(sim_server)
    ids = [m.id for m in c.models.list()]
    assert ids[:5] == ["dear", "dear:numeric", "dear:integer", "dear:math", "dear:choice"]
    assert [i for i in ids if ":" not in i] == ["dear", *SERVED]  # the catalog's
    q = synthetic_questions(1)[0]
    r = ask(c, q, seed=11, temperature=0.2, max_tokens=100_000, extra_body={"user_tag": "x"})
    dear = check_debate(r)
    assert dear["synthetic"] is True and dear["kind"] == "numeric" and dear["seed"] == 11
    assert dear["method"] == "dear" and dear["stopped"] is None  # a budget every round fits
    assert dear["ignored_parameters"] == ["temperature", "user_tag"]
    # Round 0 samples at the server's settings; the request's temperature is ignored, as documented.
    assert [a["temperature"] for a in dear["rounds"][0]["agents"]] == [0.7] * 3
    assert r.model == "dear" and r.id.startswith("chatcmpl-dear-")
    # The kind can come from the model name or the extension field.
    assert ask(c, q, model="dear:integer").model_extra["dear"]["kind"] == "integer"
    assert ask(c, q, extra_body={"dear_kind": "math"}).model_extra["dear"]["kind"] == "math"


def test_fifty_concurrent_clients_are_all_answered_and_share_batches(sim_server):
    before = httpx.get(f"{sim_server}/health").json()["scheduler"]
    questions = synthetic_questions(50, seed=3)
    clients = [client(sim_server) for _ in questions]
    start = threading.Barrier(len(questions))
    latencies: list[float] = [0.0] * len(questions)
    errors: list[str] = []
    answers: list[str | None] = [None] * len(questions)
    server_s: list[float] = [0.0] * len(questions)  # queued + debating, as the server measured it

    def one(k: int) -> None:
        start.wait()
        t0 = time.perf_counter()
        try:
            r = ask(clients[k], questions[k])
            dear = check_debate(r)
            answers[k] = r.choices[0].message.content
            server_s[k] = dear["queued_s"] + dear["debate_s"]
        except Exception as e:  # collected, so one failure does not hide the others
            errors.append(f"client {k}: {type(e).__name__}: {e}")
        latencies[k] = time.perf_counter() - t0

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(questions))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    wall = time.perf_counter() - t0
    assert not errors, errors
    assert all(a for a in answers)
    after = httpx.get(f"{sim_server}/health").json()["scheduler"]
    steps = after["steps"] - before["steps"]
    p50, p95 = statistics.median(latencies), statistics.quantiles(latencies, n=20)[18]
    print(f"\n[synthetic] 50 concurrent clients (sim backend, V=3, R=2): all answered, 0 errors; latency p50 "
          f"{p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms (of which queued + "
          f"debating in the server: p50 {statistics.median(server_s) * 1000:.0f} ms); wall {wall:.2f} s; "
          f"{steps} engine steps for 150 debate-rounds (max {after['max_debates_per_step']} debates per step)")
    assert after["debates_finished"] - before["debates_finished"] == 50
    # Overlapping requests shared engine steps: fewer steps than one per debate-round.
    assert steps < 150 and after["max_debates_per_step"] >= 2


def test_streaming_sends_each_round_then_the_answer(sim_server):
    c = client(sim_server)
    stream = ask(c, synthetic_questions(2)[1], seed=5, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    rounds = [ch.model_extra["dear"]["round"] for ch in chunks if "round" in (ch.model_extra.get("dear") or {})]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    content = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    final = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason == "stop"]
    assert len(final) == 1 and content == [final[0].model_extra["dear"]["answer"]]
    # The answer comes after every round; the usage chunk (include_usage) last, with the debate's totals.
    order = [k for k, ch in enumerate(chunks) if ch.choices and ch.choices[0].delta.content]
    assert order[0] > max(k for k, ch in enumerate(chunks) if "round" in (ch.model_extra.get("dear") or {}))
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == sum(
        a["completion_tokens"] for r in rounds for a in r["agents"])


def test_bad_requests_get_400_naming_the_problem(sim_server):
    url = f"{sim_server}/v1/chat/completions"
    q = synthetic_questions(1)[0]
    user = [{"role": "user", "content": q}]
    cases = [
        (b'{"model": "dear", "messages": [', 400, "malformed JSON"),
        (b'{"model": "dear", "seed": ' + b"9" * 5000 + b"}", 400, "an integer of 5000 digits"),  # not a 500
        (b"[" * 100_000, 400, "nested too deeply"),  # not a 500
        (["not", "an", "object"], 400, "JSON object"),
        ({"model": "dear"}, 400, "'messages'"),
        ({"model": "dear", "messages": "hello"}, 400, "'messages'"),
        ({"model": "dear", "messages": []}, 400, "'messages'"),
        ({"model": "dear", "messages": [{"role": "system", "content": "be brief"}]}, 400, "no message with role 'user'"),
        ({"model": "dear", "messages": [{"role": "user", "content": "  "}]}, 400, "empty"),
        ({"model": "dear", "messages": [{"role": "robot", "content": q}]}, 400, "'messages.0.role'"),
        ({"model": "dear", "messages": user, "stream": "yes"}, 400, "'stream'"),
        ({"model": "dear", "messages": user, "temperature": "hot"}, 400, "'temperature'"),
        ({"model": "dear", "messages": user, "seed": 1.5}, 400, "'seed'"),
        ({"model": 7, "messages": user}, 400, "'model'"),
        ({"model": "dear", "messages": user, "n": 2}, 400, "'n'"),
        ({"model": "dear", "messages": user, "tools": [{"type": "function"}]}, 400, "tools"),
        ({"model": "dear", "messages": user, "response_format": {"type": "json_object"}}, 400, "response_format"),
        ({"model": "dear", "messages": user, "logprobs": True}, 400, "logprobs"),
        ({"model": "dear", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text content"),
        ({"model": "dear:essay", "messages": user}, 400, "unknown answer kind 'essay'"),
        ({"model": "dear", "messages": user, "dear_kind": "choice"}, 400, "dear_choices"),
        ({"model": "dear:integer", "messages": user, "dear_kind": "math"}, 400, "given twice"),
        ({"model": "dear", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}, 400, "synthetic"),
        ({"model": "gpt-4o", "messages": user}, 404, "does not exist"),
        ({"model": "dear", "messages": user, "max_tokens": 50}, 400, "budget of 50"),
        ({"model": "dear", "messages": user, "dear_max_rounds": 1.5}, 400, "'dear_max_rounds'"),
    ]
    for body, status, needle in cases:
        r = httpx.post(url, content=body) if isinstance(body, bytes) else httpx.post(url, json=body)
        assert r.status_code == status, (body, r.text)
        message = r.json()["error"]["message"]
        assert needle in message, (body, message)
    # Content given as text parts is accepted; the official client surfaces a 400's message.
    r = httpx.post(url, json={"model": "dear", "messages": [{"role": "user", "content": [{"type": "text", "text": q}]}]})
    assert r.status_code == 200, r.text
    with pytest.raises(openai.BadRequestError, match="only n=1"):
        ask(client(sim_server), q, n=2)


def test_a_full_queue_gets_429(policy):
    """The bound on waiting requests, in-process: a scheduler that is never started keeps its queue full."""
    from starlette.testclient import TestClient

    from dear.infer import RegulatedDebater, make_question
    from dear.sim import SimBackend
    from dear.serve.app import create_app
    from dear.serve.scheduler import DebateJob, DebateScheduler, QueueFull

    scheduler = DebateScheduler(lambda: RegulatedDebater(policy, SimBackend()), max_queue=1)
    assert scheduler.connect()
    scheduler.start = lambda: None  # nobody drains the queue
    scheduler.submit(DebateJob(make_question("x"), None, notify=lambda e: None))
    with pytest.raises(QueueFull, match="max_queue=1"):
        scheduler.submit(DebateJob(make_question("y"), None, notify=lambda e: None))
    with TestClient(create_app(scheduler)) as http:
        r = http.post("/v1/chat/completions", json={"model": "dear", "messages": [
            {"role": "user", "content": synthetic_questions(1)[0]}]})
    assert r.status_code == 429 and "max_queue=1" in r.json()["error"]["message"]
    assert r.headers["retry-after"] == "1"


# ---------------------------------------------------------------------------------------------------
# openai: backend against the latency-simulating stand-in server


def test_stream_rounds_arrive_as_they_finish(policy, tmp_path):
    """64 tokens x 5 ms = ~0.3 s per round: each round's chunk must arrive well before the answer."""
    with latency_server(free_port(), tmp_path) as backend_url, \
            dear_server(policy, f"openai:{backend_url}#latency-sim", tmp_path) as base:
        t0 = time.perf_counter()
        arrivals = []
        for ch in ask(client(base), "What is 40 + 2?", model="dear:integer", stream=True):
            dear = ch.model_extra.get("dear") or {}
            if "round" in dear:
                arrivals.append(("round", dear["round"]["round"], time.perf_counter() - t0))
            elif ch.choices and ch.choices[0].delta.content:
                arrivals.append(("answer", ch.choices[0].delta.content, time.perf_counter() - t0))
        # A streaming client that goes away after round 0 has its debate dropped at the next round.
        body = {"model": "dear:integer", "stream": True, "messages": [{"role": "user", "content": "What is 1 + 1?"}]}
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if '"round": {"round": 0' in line:
                    break
        deadline = time.monotonic() + 10
        while httpx.get(f"{base}/health").json()["scheduler"]["debates_cancelled"] < 1:
            assert time.monotonic() < deadline, httpx.get(f"{base}/health").json()
            time.sleep(0.1)
        assert httpx.get(f"{base}/health").json()["scheduler"]["debates_finished"] == 1  # only the first one
    assert [a[:2] for a in arrivals][:3] == [("round", 0), ("round", 1), ("round", 2)]
    assert arrivals[3][0] == "answer" and arrivals[3][1] in ("41", "42")
    t_round0, t_round1, t_answer = arrivals[0][2], arrivals[1][2], arrivals[3][2]
    assert t_answer - t_round0 > 0.45 and t_answer - t_round1 > 0.2, arrivals  # two and one rounds of ~0.32 s


def test_backend_down_gives_503_with_the_reason(policy, tmp_path):
    dead = free_port()  # nothing listens here
    with dear_server(policy, f"openai:http://127.0.0.1:{dead}/v1#latency-sim", tmp_path,
                     "--llm-option", "max_retries=0") as base:
        c = client(base)
        with pytest.raises(openai.InternalServerError) as err:
            ask(c, "What is 40 + 2?")
        assert err.value.status_code == 503 and "ConnectError" in str(err.value)
        health = httpx.get(f"{base}/health")
        assert health.status_code == 503 and "ConnectError" in health.json()["reason"]
        r = httpx.post(f"{base}/v1/chat/completions", json={
            "model": "dear", "stream": True, "messages": [{"role": "user", "content": "What is 40 + 2?"}]})
        assert r.status_code == 503 and "ConnectError" in r.json()["error"]["message"]


def test_backend_unreachable_at_start_then_back(policy, tmp_path):
    """No model name given and the server is down: the model cannot be listed, so every request gets 503
    until the backend answers; then the next request (after --backend-retry-s) is served."""
    port = free_port()
    with dear_server(policy, f"openai:http://127.0.0.1:{port}/v1", tmp_path, "--backend-retry-s", "0.5",
                     health_ok=(503,)) as base:
        health = httpx.get(f"{base}/health").json()
        assert health["status"] == "unavailable" and "could not list models" in health["reason"]
        with pytest.raises(openai.InternalServerError, match="could not list models"):
            ask(client(base), "What is 40 + 2?")
        with latency_server(port, tmp_path):
            time.sleep(0.6)
            r = ask(client(base), "What is 40 + 2?", model="dear:integer")
            assert check_debate(r)["backend"] == "openai:latency-sim"
            assert httpx.get(f"{base}/health").json()["status"] == "ok"


# ---------------------------------------------------------------------------------------------------
# The real model


@pytest.mark.slow
def test_round_trip_on_the_smoke_model(policy, tmp_path):
    """SmolLM2-135M through llama.cpp (its answers are nonsense; the plumbing is what is checked)."""
    t0 = time.perf_counter()
    with dear_server(policy, "smoke", tmp_path, "--n-rounds", "1", "--max-tokens", "32", "--kind", "integer",
                     "--max-active", "2") as base:  # 6 llama.cpp slots, not 16
        t_ready = time.perf_counter() - t0
        r = ask(client(base), "What is 12 + 30?", seed=3)
        t_request = time.perf_counter() - t0 - t_ready
    dear = check_debate(r, rounds=1)
    assert dear["backend"].startswith("smoke:") and dear["synthetic"] is False
    assert dear["policy_trained_on_synthetic"] is True and dear["kind"] == "integer"
    print(f"\nsmoke: server ready in {t_ready:.1f} s, one debate request {t_request:.1f} s: "
          f"{json.dumps(r.model_dump())[:400]}")
