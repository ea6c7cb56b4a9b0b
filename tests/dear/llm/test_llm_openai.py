"""OpenAICompatBackend: against a real llama.cpp HTTP server (xllamacpp + smoke model) on 127.0.0.1, and
against a small fault-injecting server for retries, backoff, timeouts and give-up."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from dear.llm import BackendError, ChatMessage, ChatRequest, make_backend
from dear.llm.openai_compat import OpenAICompatBackend

HELLO = (ChatMessage("user", "Say hello."),)


# --- a real llama.cpp server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_server_url():
    xllamacpp = pytest.importorskip("xllamacpp")
    from dear.llm.model_files import smoke_model_path

    params = xllamacpp.CommonParams()
    params.model.path = str(smoke_model_path())
    params.n_parallel = 3
    params.n_ctx = 3 * 1024
    params.verbosity = 0
    params.cpuparams.n_threads = 1  # robust on a shared CPU (see test_llm_local.THREADS)
    params.cpuparams_batch.n_threads = 1
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # the OS picks a free port; listening_address reports it
    server = xllamacpp.Server(params)
    for _ in range(500):  # wait for the HTTP thread (see LocalLlamaBackend._wait_until_ready)
        try:
            if httpx.get(server.listening_address + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.01)
    yield server.listening_address + "/v1"
    del server


def test_real_server_batch(llama_server_url):
    backend = make_backend(f"openai:{llama_server_url}", max_concurrency=3)
    assert backend.model.endswith(".gguf")  # discovered through GET /v1/models
    poem = (ChatMessage("user", "Write a short poem about the sea."),)
    requests = [
        ChatRequest(poem, temperature=0.0, seed=3, max_tokens=10),
        ChatRequest(poem, temperature=0.0, seed=3, max_tokens=10),
        ChatRequest(poem, temperature=1.0, seed=4, max_tokens=5),
    ]
    out = backend.generate(requests)
    assert all(c.ok for c in out), [c.error for c in out]
    assert out[0].text == out[1].text and out[0].text
    assert out[2].completion_tokens == 5 and out[2].finish_reason == "length"
    assert all(c.prompt_tokens > 5 for c in out)
    assert backend.count_tokens("hello world") == 2  # the server's /tokenize, not the estimate


def test_real_server_explicit_model_and_async_caller(llama_server_url):
    backend = make_backend(f"openai:{llama_server_url}#whatever-name")
    assert backend.model == "whatever-name"

    async def inside_a_loop():
        return backend.generate([ChatRequest(HELLO, temperature=0.0, max_tokens=3)])

    (c,) = asyncio.run(inside_a_loop())
    assert c.ok and c.completion_tokens == 3


# --- a fault-injecting server -----------------------------------------------------------------------------


def _ok_body(text="ok", usage=True):
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]
    }
    if usage:
        body["usage"] = {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}
    return body


class FaultServer:
    """Paths are /<scenario>/v1/...; the scenario decides each reply from its per-scenario hit count."""

    def __init__(self):
        self.hits: dict[str, int] = {}
        self.times: dict[str, list[float]] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body, headers=()):
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    for k, v in headers:
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def do_GET(self):
                if self.path.endswith("/v1/models"):
                    self._send(
                        200, {"object": "list", "data": [{"id": "fault-model", "max_model_len": 4096}]}
                    )
                else:
                    self._send(404, {"error": "no such path"})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                scenario = self.path.split("/")[1]
                with owner.lock:
                    n = owner.hits.get(scenario, 0)
                    owner.hits[scenario] = n + 1
                    owner.times.setdefault(scenario, []).append(time.monotonic())
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                try:
                    owner.reply(self, scenario, n)
                finally:
                    with owner.lock:
                        owner.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, scenario):
        return f"http://127.0.0.1:{self.httpd.server_port}/{scenario}/v1"

    def reply(self, h, scenario, n):
        if scenario == "flaky":  # two 500s, then success
            return h._send(500, {"error": "boom"}) if n < 2 else h._send(200, _ok_body("recovered"))
        if scenario == "ratelimit":  # one 429 asking for 0.3 s, then success
            return (
                h._send(429, {"error": "slow down"}, [("Retry-After", "0.3")])
                if n < 1
                else h._send(200, _ok_body())
            )
        if scenario == "down":
            return h._send(503, {"error": "down"})
        if scenario == "badrequest":
            return h._send(400, {"error": {"message": "bad field"}})
        if scenario == "stall":  # first attempt hangs past the client timeout
            if n < 1:
                time.sleep(1.5)
            return h._send(200, _ok_body("after stall"))
        if scenario == "slow":
            time.sleep(0.2)
            return h._send(200, _ok_body())
        if scenario == "nousage":
            return h._send(200, _ok_body("four", usage=False))
        return h._send(404, {"error": "unknown scenario"})

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def faults():
    server = FaultServer()
    yield server
    server.close()


def _backend(url, **kw):
    kw.setdefault("backoff_base_s", 0.05)
    kw.setdefault("backoff_max_s", 0.2)
    kw.setdefault("timeout_s", 5)
    return OpenAICompatBackend(url, **kw)


def test_model_discovery_and_context(faults):
    backend = _backend(faults.url("flaky"))
    assert backend.model == "fault-model" and backend.context_length == 4096
    assert backend.model_id == "openai:fault-model"


def test_retries_500_then_succeeds(faults):
    (c,) = _backend(faults.url("flaky")).generate([ChatRequest(HELLO)])
    assert c.ok and c.text == "recovered" and (c.prompt_tokens, c.completion_tokens) == (7, 1)
    assert faults.hits["flaky"] == 3


def test_honours_retry_after(faults):
    (c,) = _backend(faults.url("ratelimit")).generate([ChatRequest(HELLO)])
    assert c.ok and faults.hits["ratelimit"] == 2
    first, second = faults.times["ratelimit"]
    assert second - first >= 0.3  # the server asked for 0.3 s, far above our 0.05 s backoff


def test_gives_up_cleanly_after_retries(faults):
    backend = _backend(faults.url("down"), max_retries=3, backoff_base_s=0.1, backoff_max_s=0.15)
    started = time.monotonic()
    out = backend.generate([ChatRequest(HELLO), ChatRequest(HELLO)])
    elapsed = time.monotonic() - started
    assert all(
        not c.ok and c.finish_reason == "error" and "503" in c.error and "4 attempt" in c.error for c in out
    )
    assert faults.hits["down"] == 2 * 4
    # backoff: delays of 0.05-0.1, 0.075-0.15, 0.075-0.15 between the 4 attempts of each request
    assert 0.2 <= elapsed < 3
    gaps = [b - a for a, b in zip(faults.times["down"][::2], faults.times["down"][2::2])]
    assert min(gaps) > 0.04


def test_no_retry_on_400(faults):
    (c,) = _backend(faults.url("badrequest")).generate([ChatRequest(HELLO)])
    assert not c.ok and "400" in c.error and "bad field" in c.error
    assert faults.hits["badrequest"] == 1


def test_timeout_is_retried(faults):
    (c,) = _backend(faults.url("stall"), timeout_s=0.4).generate([ChatRequest(HELLO)])
    assert c.ok and c.text == "after stall" and faults.hits["stall"] == 2


def test_timeouts_until_give_up(faults):
    backend = _backend(faults.url("stall"), timeout_s=0.2, max_retries=0)
    (c,) = backend.generate([ChatRequest(HELLO)])
    assert not c.ok and "Timeout" in c.error


def test_bounded_concurrency(faults):
    backend = _backend(faults.url("slow"), max_concurrency=2)
    out = backend.generate([ChatRequest(HELLO) for _ in range(6)])
    assert all(c.ok for c in out)
    assert faults.max_in_flight == 2


def test_missing_usage_is_estimated(faults):
    (c,) = _backend(faults.url("nousage")).generate([ChatRequest(HELLO)])
    assert c.ok and c.completion_tokens == 1 and c.prompt_tokens >= 1


def test_connection_refused_gives_up():
    backend = OpenAICompatBackend(
        "http://127.0.0.1:9/v1",
        model="m",
        max_retries=2,
        backoff_base_s=0.01,
        backoff_max_s=0.02,
        timeout_s=1,
    )
    (c,) = backend.generate([ChatRequest(HELLO)])
    assert not c.ok and "Connect" in c.error and "3 attempt" in c.error


def test_unreachable_model_discovery_is_a_backend_error():
    with pytest.raises(BackendError, match="connection refused.*is the server running"):
        OpenAICompatBackend("http://127.0.0.1:9/v1", timeout_s=1)


# --- a silent server: accepts connections, never answers -------------------------------------------------


class SilentServer:
    """A real TCP server on 127.0.0.1 that accepts every connection and never reads or writes a byte."""

    def __init__(self):
        import socket

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.conns = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture()
def silent():
    server = SilentServer()
    yield server
    server.close()


def test_read_timeout_scales_with_max_tokens_and_default_bound_is_about_two_minutes():
    b = OpenAICompatBackend("http://127.0.0.1:9/v1", model="m")
    assert b.read_timeout(1024) > b.read_timeout(512) > b.read_timeout(64)
    assert 100 <= b.request_budget(512) <= 135  # the default max_tokens of the CLIs and configs
    assert b.request_budget(384) < b.request_budget(512)
    fixed = OpenAICompatBackend("http://127.0.0.1:9/v1", model="m", timeout_s=7, total_timeout_s=9)
    assert fixed.read_timeout(4096) == 7 and fixed.request_budget(4096) == 9
    with pytest.raises(ValueError, match="connect_timeout_s"):
        OpenAICompatBackend("http://127.0.0.1:9/v1", model="m", connect_timeout_s=0)


def test_silent_server_is_abandoned_within_the_bound(silent):
    """Retries count inside the bound: 2 attempts of <= 0.5 s within a 1.2 s limit, then a clear error; the
    requests of the batch still waiting for a slot fail at once instead of waiting again."""
    backend = make_backend(f"openai:{silent.url}#m", read_timeout_base_s=0.3, read_timeout_per_token_s=0.001,
                           total_timeout_s=1.2, backoff_base_s=0.05, backoff_max_s=0.1, max_concurrency=2)
    assert backend.read_timeout(200) == pytest.approx(0.5)
    started = time.monotonic()
    out = backend.generate([ChatRequest(HELLO, max_tokens=200) for _ in range(6)])
    elapsed = time.monotonic() - started
    assert elapsed < 2.5, elapsed  # not 6 requests x 6 attempts x 120 s
    first, later = out[:2], out[2:]
    for c in first:
        assert not c.ok and c.error.startswith("server never replied:") and silent.url in c.error
        assert "no reply within" in c.error and "max_tokens=200" in c.error and "1.2s limit" in c.error
        assert "attempt(s)" in c.error
    assert all(not c.ok and c.error.startswith("not sent: the server gave no reply") for c in later)
    assert len(silent.conns) >= 2  # it really accepted the connections


def test_silent_server_model_listing_says_it_timed_out(silent):
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"accepted the connection but sent no reply within 0\.3s"):
        OpenAICompatBackend(silent.url, list_timeout_s=0.3)
    assert time.monotonic() - started < 2
    backend = OpenAICompatBackend(silent.url, model="m", list_timeout_s=0.3)
    started = time.monotonic()
    assert backend.count_tokens("hello world") == 2  # /tokenize gave nothing: the ~4 chars/token estimate
    assert time.monotonic() - started < 2


def test_model_listing_bad_response_is_named(faults):
    with pytest.raises(BackendError, match=r"HTTP 404.*#model-name"):
        OpenAICompatBackend(faults.url("nomodels").replace("/v1", "/nothing"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_silent_server_default_bound(silent):
    """With the default timeouts a silent server is abandoned within about 2 minutes (max_tokens 512)."""
    backend = make_backend(f"openai:{silent.url}#m")
    started = time.monotonic()
    (c,) = backend.generate([ChatRequest(HELLO, max_tokens=512)])
    elapsed = time.monotonic() - started
    assert not c.ok and c.error.startswith("server never replied:")
    assert 100 <= elapsed <= 135, elapsed


# --- connection reuse -------------------------------------------------------------------------------------


class KeepAliveServer:
    """An HTTP/1.1 server on 127.0.0.1 that counts the TCP connections it accepted."""

    def __init__(self):
        self.connections = 0
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive

            def setup(self):  # once per accepted connection
                super().setup()
                with owner.lock:
                    owner.connections += 1

            def log_message(self, *args):
                pass

            def _send(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"object": "list", "data": [{"id": "keepalive-model"}]})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.endswith("/tokenize"):
                    self._send({"tokens": [1, 2, 3]})
                else:
                    self._send(_ok_body())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_one_client_per_backend_reuses_its_connections():
    server = KeepAliveServer()
    try:
        backend = OpenAICompatBackend(server.url, max_concurrency=2)  # lists models: one short-call connection
        batch = [ChatRequest(HELLO, max_tokens=4) for _ in range(2)]
        for _ in range(5):
            assert all(c.ok for c in backend.generate(batch))
        for _ in range(5):
            assert backend.count_tokens("a b c") == 3
        # Threads calling generate at once share the client too (the engine's concurrent debates do).
        threads = [threading.Thread(target=backend.generate, args=(batch,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # 1 connection for the short calls (models, tokenize) + at most max_concurrency for chat calls,
        # against 1 + 5 + 5 + 3 x 2 = 17 with a client per call.
        assert server.connections <= 1 + 2, server.connections
        backend.close()
        backend.close()  # idempotent
        with pytest.raises(BackendError, match="closed"):
            backend.generate(batch)
    finally:
        server.close()


# --- log-probabilities --------------------------------------------------------------------------------------


def test_real_server_sends_log_probabilities_when_asked(llama_server_url):
    backend = make_backend(f"openai:{llama_server_url}", max_concurrency=2)
    asked, plain = backend.generate([ChatRequest(HELLO, temperature=0.7, seed=5, max_tokens=8, logprobs=3),
                                     ChatRequest(HELLO, temperature=0.7, seed=5, max_tokens=8)])
    assert asked.ok and plain.ok and plain.logprobs is None
    lp = asked.logprobs
    # the usage may also count an end-of-generation token, which has no streamed log-probability
    assert 0 < len(lp.chosen) <= asked.completion_tokens and len(lp.chosen) == len(lp.top) == len(lp.nbytes)
    assert all(len(t) == 3 and list(t) == sorted(t, reverse=True) for t in lp.top)
    assert all(c <= 0 for c in lp.chosen) and sum(lp.nbytes) == len(asked.text.encode("utf-8"))


def test_a_server_that_sends_no_log_probabilities_gives_the_turn_a_missing_marker(faults):
    """The engine asks for confidence; the server answers without logprobs: the turn says so, with no number."""
    from dear import tasks
    from dear.debate.engine import DebateConfig, DebateEngine
    from dear.debate.protocols import MajorityProtocol

    backend = _backend(faults.url("nousage"))
    (q,) = tasks.load("gsm8k", "test", n=1)
    (d,) = DebateEngine(backend, DebateConfig(n_agents=2, n_rounds=0, logprobs=3)).run([q], MajorityProtocol())
    for turn in d.trace.rounds[0]:
        assert turn.confidence == {"missing": "openai:fault-model sent no log-probabilities"}
    assert '"missing"' in d.trace.to_json()
