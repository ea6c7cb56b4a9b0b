"""The server's limits and its API key, on real `python -m dear.serve` processes on 127.0.0.1 spoken
to with the official `openai` client (helpers and the exported sim policy come from tests/dear/serve/test_serve.py).

- `--api-key` / DEAR_API_KEY: every endpoint but /health needs `Authorization: Bearer KEY` (401 otherwise);
- a question whose debate cannot fit the backend's context: 400 `context_length_exceeded` before any agent
  runs, on the real smoke model (SmolLM2 GGUF through llama.cpp), and /health stays 200;
- seeds outside 0 ... 2**63-1: 400 naming `seed`;
- request bodies over `--max-body-size` (default 4 MiB): 413.
"""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")

from tests.dear.serve.test_serve import ask, client, dear_server, export_sim_policy, synthetic_questions  # noqa: E402

KEY = "test-key-0123456789abcdef"
MiB = 1024 * 1024


def error_of(r: httpx.Response) -> dict:
    """OpenAI's error body, checked for its shape."""
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return export_sim_policy(tmp_path_factory.mktemp("sim-run"))


@pytest.fixture(scope="module")
def keyed_server(policy, tmp_path_factory):
    """sim backend; the key from DEAR_API_KEY; the default body limit."""
    with dear_server(policy, "sim", tmp_path_factory.mktemp("keyed"), env={"DEAR_API_KEY": KEY}) as base:
        yield base


def keyed(base: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)


# ---------------------------------------------------------------------------------------------------
# --api-key


def test_every_endpoint_but_health_needs_the_key(keyed_server):
    q = synthetic_questions(1)[0]
    # With the key: 200.
    c = keyed(keyed_server)
    assert [m.id for m in c.models.list()][0] == "dear"
    assert ask(c, q, seed=1).choices[0].message.content
    # A wrong key: 401 through the official client, for plain, streamed and listing calls alike.
    wrong = keyed(keyed_server, "not-the-key")
    for call in (lambda: wrong.models.list(), lambda: ask(wrong, q), lambda: list(ask(wrong, q, stream=True))):
        with pytest.raises(openai.AuthenticationError) as err:
            call()
        assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
        assert "incorrect API key" in err.value.message and "not-the-key" not in err.value.message
    # No key at all, or another scheme: 401 in OpenAI's error shape, on every path (unknown ones too).
    body = {"model": "dear", "messages": [{"role": "user", "content": q}]}
    for method, path, headers in [("GET", "/v1/models", {}), ("POST", "/v1/chat/completions", {}),
                                  ("GET", "/v1/nothing-here", {}),
                                  ("POST", "/v1/chat/completions", {"Authorization": f"Basic {KEY}"}),
                                  ("POST", "/v1/chat/completions", {"Authorization": "Bearer"})]:
        r = httpx.request(method, f"{keyed_server}{path}", json=body if method == "POST" else None,
                          headers=headers)
        assert r.status_code == 401, (path, headers, r.text)
        e = error_of(r)
        assert e["code"] == "invalid_api_key" and e["type"] == "invalid_request_error"
        assert "Authorization: Bearer" in e["message"] and r.headers["www-authenticate"] == "Bearer"
    # /health needs none.
    health = httpx.get(f"{keyed_server}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_api_key_flag_and_body_limit_flag(policy, tmp_path):
    """`--api-key KEY` (instead of the environment) and `--max-body-size 64KiB` on one server."""
    with dear_server(policy, "sim", tmp_path, "--api-key", "flag-key", "--max-body-size", "64KiB",
                     env={"DEAR_API_KEY": "ignored-env-key"}) as base:
        with pytest.raises(openai.AuthenticationError):
            keyed(base, "ignored-env-key").models.list()
        c = keyed(base, "flag-key")
        assert ask(c, synthetic_questions(1)[0]).choices[0].message.content
        with pytest.raises(openai.APIStatusError) as err:
            ask(c, "x" * 70_000)
        assert err.value.status_code == 413 and err.value.code == "request_too_large"
        assert "at most 65536 bytes" in err.value.message
        assert httpx.get(f"{base}/health").status_code == 200


# ---------------------------------------------------------------------------------------------------
# seeds and body size


def test_seeds_outside_0_to_2_63_are_400_naming_the_field(keyed_server):
    c = keyed(keyed_server)
    q = synthetic_questions(1)[0]
    for seed in (10**30, 2**63, -1, -(2**63)):
        with pytest.raises(openai.BadRequestError) as err:
            ask(c, q, seed=seed)
        assert err.value.param == "seed" and "'seed'" in err.value.message, err.value.message
    for seed in (0, 2**63 - 1):
        assert ask(c, q, seed=seed).model_extra["dear"]["seed"] == seed


def test_a_body_over_the_default_limit_is_413(keyed_server):
    c = keyed(keyed_server)
    with pytest.raises(openai.APIStatusError) as err:  # Content-Length says it: refused before reading
        ask(c, "x" * (5 * MiB))
    assert err.value.status_code == 413 and err.value.code == "request_too_large"
    assert "at most 4194304 bytes" in err.value.message and "--max-body-size" in err.value.message

    def chunks():  # no Content-Length (chunked upload): refused once 4 MiB have arrived
        yield b'{"model": "dear", "messages": [{"role": "user", "content": "'
        for _ in range(80):
            yield b"x" * 65536
        yield b'"}]}'

    r = httpx.post(f"{keyed_server}/v1/chat/completions", content=chunks(), timeout=60,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"
    # Under the limit the body is read: 3 MiB of question is then too long for the sim's 32768-token context.
    with pytest.raises(openai.BadRequestError) as err:
        ask(c, synthetic_questions(1)[0] + " x" * (3 * MiB // 2))
    assert err.value.code == "context_length_exceeded" and err.value.param == "messages"
    assert httpx.get(f"{keyed_server}/health").status_code == 200


# ---------------------------------------------------------------------------------------------------
# The context: the real smoke model


@pytest.mark.slow
def test_too_long_for_the_context_is_400_on_the_smoke_model(policy, tmp_path):
    """SmolLM2-135M through llama.cpp (2048-token slots, one thread): refused before any agent runs."""
    with dear_server(policy, "smoke", tmp_path, "--n-rounds", "1", "--max-tokens", "32", "--kind", "integer",
                     "--max-active", "1") as base:
        c = client(base)
        long_question = "What is 12 + 30? " + "blah " * 30_000  # ~60,000 tokens
        for stream in (False, True):  # a stream too: the status comes before any chunk
            with pytest.raises(openai.BadRequestError) as err:
                ask(c, long_question, stream=stream)
            assert err.value.code == "context_length_exceeded" and err.value.param == "messages"
            assert err.value.body["type"] == "invalid_request_error"
            message = err.value.message
            assert "maximum context length is 2048 tokens" in message and "round 0's prompt" in message
            health = httpx.get(f"{base}/health")
            assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        # Fits round 0, but not round 1, whose prompt repeats the question with the peers' answers.
        with pytest.raises(openai.BadRequestError) as err:
            ask(c, "What is 12 + 30? " + "blah " * 500)
        assert err.value.code == "context_length_exceeded" and "last round, round 1" in err.value.message
        scheduler = httpx.get(f"{base}/health").json()["scheduler"]
        assert scheduler["steps"] == 0 and scheduler["last_backend_error"] is None  # no agent ran


# ---------------------------------------------------------------------------------------------------
# In-process: what the backend refuses during a debate, and the command line


CONTEXT_REFUSAL = ("server error: request (2390 tokens) exceeds the available context size (2048 tokens), "
                   "try increasing it")  # llama.cpp's words


def refusing_backend(error: str, from_round: int = 0):
    """A SimBackend that refuses every request of round `from_round` on with `error` (as a backend does after
    its retries)."""
    from dear.llm.base import Completion
    from dear.sim import SimBackend

    class Refusing(SimBackend):
        def generate(self, requests):
            if requests and requests[0].metadata["round"] >= from_round:
                return [Completion("", 0, 0, "error", 0.0, error=error) for _ in requests]
            return super().generate(requests)

    return Refusing()


def in_process(policy, backend):
    from starlette.testclient import TestClient

    from dear.infer import RegulatedDebater
    from dear.serve.app import create_app
    from dear.serve.scheduler import DebateScheduler

    scheduler = DebateScheduler(lambda: RegulatedDebater(policy, backend), batch_window_s=0.0)
    assert scheduler.connect()
    return TestClient(create_app(scheduler))


@pytest.mark.parametrize("error,status,code,health", [
    (CONTEXT_REFUSAL, 400, "context_length_exceeded", 200),
    ("ConnectError: [Errno 111] Connection refused (after 1 attempt(s) in 0.0s)", 503, "backend_unavailable", 503),
])
def test_a_context_refusal_by_the_backend_is_the_requests_fault(policy, error, status, code, health):
    """A backend that refuses the prompt as too long (one that passed the server's own check): 400 and /health
    stays 200; a backend that cannot be reached: 503 and /health 503, as before."""
    with in_process(policy, refusing_backend(error)) as http:
        body = {"model": "dear", "messages": [{"role": "user", "content": synthetic_questions(1)[0]}]}
        for stream in (False, True):
            r = http.post("/v1/chat/completions", json=body | {"stream": stream})
            assert r.status_code == status and error_of(r)["code"] == code, r.text
            assert error[:30] in error_of(r)["message"]  # the backend's own words
        assert http.get("/health").status_code == health


def test_a_context_refusal_in_a_later_round_ends_the_stream_with_that_code(policy):
    with in_process(policy, refusing_backend(CONTEXT_REFUSAL, from_round=1)) as http:
        question = synthetic_questions(1)[0]
        body = {"model": "dear", "stream": True, "messages": [{"role": "user", "content": question}]}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200  # round 0 went through: the stream had begun
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert "round" in events[1]["dear"] and events[1]["dear"]["round"]["round"] == 0
        error = events[-1]["error"]
        assert error["code"] == "context_length_exceeded" and "context size" in error["message"]
        r = http.post("/v1/chat/completions", json=body | {"stream": False})
        assert r.status_code == 400 and error_of(r)["code"] == "context_length_exceeded"
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["scheduler"]["last_backend_error"] is None


def test_settings_and_command_line(monkeypatch):
    from dear.serve.__main__ import exposure_warning, parse_args
    from dear.serve.app import ServeSettings

    monkeypatch.setenv("DEAR_API_KEY", "from-env")
    a = parse_args(["--policy", "p"])
    assert a.api_key == "from-env" and a.max_body_size == 4 * MiB
    a = parse_args(["--policy", "p", "--api-key", "from-flag", "--max-body-size", "64KiB"])
    assert a.api_key == "from-flag" and a.max_body_size == 65536
    monkeypatch.setenv("DEAR_API_KEY", "")
    assert parse_args(["--policy", "p"]).api_key is None  # empty: no key
    for bad in (["--max-body-size", "0"], ["--max-body-size", "lots"], ["--api-key", " "], ["--model-name", "sc"]):
        with pytest.raises(SystemExit):
            parse_args(["--policy", "p", *bad])
    # Bound beyond loopback without a key: a warning at start.
    assert "all interfaces without an API key" in exposure_warning("0.0.0.0", None)
    assert "without an API key" in exposure_warning("192.168.1.20", None)
    assert exposure_warning("0.0.0.0", "k") is None
    assert exposure_warning("127.0.0.1", None) is None and exposure_warning("localhost", None) is None
    assert "secret" not in repr(ServeSettings(api_key="secret"))
    with pytest.raises(ValueError, match="a baseline's"):  # DEAR cannot be renamed to a baseline's name
        ServeSettings(model_name="mad")
    with pytest.raises(ValueError):
        ServeSettings(max_body_size=0)
