"""A repeatable llama.cpp backend (`LocalLlamaBackend(repeatable=True)`): one request at a time, in submission
order, no prompt-cache reuse, so a seeded batch gives the same texts on any fresh backend; and the flag of the CLIs
and the train config that turns it on (refused where a backend cannot repeat)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from dear.debate.cli_args import repeatable_of
from dear.llm import ChatMessage, ChatRequest, make_backend
from dear.llm.local import LocalLlamaBackend, _StreamedChat
from dear.llm.registry import check_repeatable

THREADS = 1  # one llama.cpp thread: on a shared machine threads spinning at barriers slow each other ~10x
QUESTIONS = ("What is 17 * 23? Explain briefly.", "Name three rivers of Europe.", "Why is the sky blue?")


def seeded_batch(max_tokens: int = 24) -> list[ChatRequest]:
    """Three sampled requests (temperature 0.8) with their own seeds, sharing a system prompt prefix."""
    system = ChatMessage("system", "You are a careful assistant. Answer in one or two sentences.")
    return [ChatRequest((system, ChatMessage("user", q)), temperature=0.8, top_p=0.95, seed=100 + i,
                        max_tokens=max_tokens, session=f"d0/agent{i}") for i, q in enumerate(QUESTIONS)]


class ConcurrencySpy:
    """Counts, at every streamed chunk, the requests a backend has inside llama.cpp (`peak`), and records the seeds of
    the requests in the order the backend starts them (`started`)."""

    def __init__(self, monkeypatch):
        self.backend: LocalLlamaBackend | None = None
        self.peak = 0
        self.started: list[int | None] = []
        on_chunk, one = _StreamedChat.on_chunk, LocalLlamaBackend._one

        def counting(stream, chunk):
            if self.backend is not None:
                self.peak = max(self.peak, self.backend._in_flight)
            return on_chunk(stream, chunk)

        def starting(backend, request):
            self.started.append(request.seed)
            return one(backend, request)

        monkeypatch.setattr(_StreamedChat, "on_chunk", counting)
        monkeypatch.setattr(LocalLlamaBackend, "_one", starting)


def repeatable_smoke() -> LocalLlamaBackend:
    pytest.importorskip("xllamacpp")
    return make_backend("smoke", n_parallel=1, n_ctx=1024, n_threads=THREADS, repeatable=True)


def test_two_fresh_repeatable_backends_give_the_same_texts_one_request_at_a_time(monkeypatch):
    """The same seeded batch of 3 on two fresh repeatable backends: the same texts, each request decoded alone in
    submission order (never more than one inside llama.cpp) and none starting from an earlier prompt's KV cache."""
    spy = ConcurrencySpy(monkeypatch)
    batch = seeded_batch()
    runs = []
    for _ in range(2):
        backend = repeatable_smoke()
        spy.backend, spy.started = backend, []
        try:
            out = backend.generate(batch)
            again = backend.generate(batch[:1])  # the same prompt once more: still read from scratch
        finally:
            backend.close()
        assert all(c.ok for c in out + again), [c.error for c in out + again]
        assert spy.started == [r.seed for r in batch + batch[:1]]  # submission order
        assert all(c.reused_prompt_tokens == 0 for c in out + again)
        assert again[0].text == out[0].text
        runs.append([c.text for c in out])
    assert spy.peak == 1
    assert runs[0] == runs[1] and all(runs[0])


def test_the_spy_sees_parallel_slots_decode_together(monkeypatch, smoke_backend):
    """Control for the test above: the same spy on the 3-slot smoke backend sees the 3 requests in llama.cpp at once
    (so a peak of 1 there means one at a time, not a spy that cannot count)."""
    spy = ConcurrencySpy(monkeypatch)
    spy.backend = smoke_backend
    out = smoke_backend.generate([replace(r, max_tokens=48) for r in seeded_batch()])
    assert all(c.ok for c in out)
    assert spy.peak == 3


def test_concurrent_generate_calls_on_a_repeatable_backend_wait_for_each_other(monkeypatch):
    """Two threads calling generate at once (eval or serve engines do): still one request inside llama.cpp at a
    time, and each request's text is the one it has alone (no prompt-cache state carried from the other call)."""
    spy = ConcurrencySpy(monkeypatch)
    batch = seeded_batch(max_tokens=16)
    backend = repeatable_smoke()
    spy.backend = backend
    try:
        alone = [c.text for c in backend.generate(batch)]
        results: dict[int, list[str]] = {}
        threads = [threading.Thread(target=lambda k=k, part=part: results.__setitem__(
            k, [c.text for c in backend.generate(part)])) for k, part in enumerate((batch[2::-1], batch[1:]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    finally:
        backend.close()
    assert spy.peak == 1
    assert results[0] == alone[::-1] and results[1] == alone[1:]


def test_repeatable_needs_one_slot():
    with pytest.raises(ValueError, match="n_parallel must be 1, got 3"):
        LocalLlamaBackend(__file__, n_parallel=3, repeatable=True)  # refused before anything loads


def test_which_backends_can_repeat():
    """llama.cpp kinds take the option, sim and bank repeat anyway, an OpenAI-compatible server or vLLM cannot."""
    check_repeatable(["local", "smoke", "local:/m.gguf", "sim", "bank"])
    for spec in ("openai:http://127.0.0.1:9/v1", "vllm:Qwen/Qwen2.5-1.5B-Instruct"):
        with pytest.raises(ValueError, match="cannot be made repeatable"):
            check_repeatable(["smoke", spec])


def test_the_flag_and_the_parallel_slots():
    """--repeatable / --no-repeatable / neither (None: on unless --parallel asks for slots)."""
    assert repeatable_of(None, ["local"]) is True
    assert repeatable_of(None, ["local"], parallel=4) is False
    assert repeatable_of(None, ["local"], parallel=1) is True
    assert repeatable_of(False, ["openai:http://127.0.0.1:9/v1"]) is False
    assert repeatable_of(True, ["sim"]) is True
    with pytest.raises(ValueError, match="--parallel 4 decodes requests together"):
        repeatable_of(True, ["local"], parallel=4)
    with pytest.raises(ValueError, match="--llm-option n_parallel=4 decodes"):
        repeatable_of(True, ["local"], parallel=4, parallel_flag="--llm-option n_parallel=")
    with pytest.raises(ValueError, match="openai backend"):
        repeatable_of(True, ["openai:http://127.0.0.1:9/v1"])


class Built(Exception):
    """Raised by a stand-in for RegulatedDebater with the backend options dear.infer would build it with."""


def infer_options(monkeypatch, *args: str) -> dict:
    from dear import infer

    def capture(exported, llm, **options):
        raise Built(options)

    monkeypatch.setattr(infer, "RegulatedDebater", capture)
    with pytest.raises(Built) as built:
        infer.main(["--question", "What is 17 * 23?", "--kind", "integer", *args])
    return built.value.args[0]


def test_dear_infer_is_repeatable_by_default(monkeypatch):
    assert infer_options(monkeypatch, "--llm", "smoke")["n_parallel"] == 1
    assert infer_options(monkeypatch, "--llm", "smoke")["repeatable"] is True
    slots = infer_options(monkeypatch, "--llm", "smoke", "--no-repeatable")
    assert "repeatable" not in slots and slots["n_parallel"] == 3  # 1 question x the policy's 3 agents
    assert "repeatable" not in infer_options(monkeypatch, "--llm", "smoke", "--parallel", "4")
    assert "repeatable" not in infer_options(monkeypatch, "--llm", "openai:http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="openai backend"):
        infer_options(monkeypatch, "--llm", "openai:http://127.0.0.1:9/v1", "--repeatable")
    with pytest.raises(ValueError, match="--parallel 4 decodes requests together"):
        infer_options(monkeypatch, "--llm", "smoke", "--parallel", "4", "--repeatable")


def test_eval_run_is_not_repeatable_unless_asked_and_records_it():
    from eval import methods as M
    from eval import run as R

    def options(*args: str) -> dict:
        a = R.parse_args(["--benchmarks", "gsm8k", "--methods", "mad", "--out", "unused", *args])
        return R.settings_from_args(a, None, M.parse_methods("mad")).backend_options

    assert options("--llm", "smoke") == {}
    assert options("--llm", "smoke", "--repeatable") == {"n_parallel": 1, "repeatable": True}  # run.json's settings
    assert options("--llm", "sim", "--benchmarks", "synthetic", "--repeatable") == {}  # a no-op: sim repeats anyway
    with pytest.raises(ValueError, match="openai backend"):
        options("--llm", "openai:http://127.0.0.1:9/v1", "--repeatable")


def test_dear_serve_flag():
    pytest.importorskip("fastapi")
    from dear.serve.__main__ import backend_options, parse_args

    assert backend_options(parse_args(["--llm", "smoke"]), 3)[0]["n_parallel"] == 16
    repeatable = {"n_parallel": 1, "repeatable": True}
    assert backend_options(parse_args(["--llm", "smoke", "--repeatable"]), 3) == (repeatable, repeatable)
    # a llama.cpp profile backend besides a --llm of another kind decodes repeatably too
    options, profiles = backend_options(parse_args(["--llm", "sim", "--agent-profiles", "smoke:cot,cot,cot",
                                                    "--repeatable"]), 3)
    assert options == {} and profiles == repeatable
    with pytest.raises(ValueError, match="n_parallel=4 decodes requests together"):
        backend_options(parse_args(["--llm", "smoke", "--repeatable", "--llm-option", "n_parallel=4"]), 3)


def test_train_config_llm_repeatable(monkeypatch):
    from dear.llm import registry
    from train.build import make_local_backend
    from train.config import ConfigError, load_config

    built = {}
    monkeypatch.setattr(registry, "make_backend", lambda spec, **options: built.update(options))
    assert load_config("smoke").llm.repeatable is False
    make_local_backend(load_config("smoke", ["llm.repeatable=true"]))
    assert built["repeatable"] is True and built["n_parallel"] == 1  # smoke.yaml's n_parallel: 4 gives way
    with pytest.raises(ConfigError, match="llm.repeatable: the openai backend"):
        load_config("smoke", ["llm.repeatable=true", "llm.preset=openai", "llm.url=http://127.0.0.1:9/v1"])
    with pytest.raises(ConfigError, match="'llm.repeatable': expected bool"):
        load_config("smoke", ["llm.repeatable=3"])
