"""LocalLlamaBackend against the real smoke model (SmolLM2-135M through xllamacpp's llama.cpp)."""

from __future__ import annotations

import difflib
from dataclasses import replace
import threading
import time

import pytest

from dear.llm import BackendError, ChatMessage, ChatRequest, make_backend
from dear.llm.local import CANCELLED, LocalLlamaBackend, _StreamedChat, parse_chat_response, shared_prompt_runs

# One thread: on a shared (CI) machine, llama.cpp threads spinning at barriers slow each other ~10x.
THREADS = 1
PROMPT = (
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "Write a short poem about the sea."),
)


@pytest.fixture(scope="module")
def smoke():
    pytest.importorskip("xllamacpp")
    backend = make_backend("smoke", n_parallel=3, n_ctx=1024, n_threads=THREADS)
    yield backend
    backend.close()


def test_batch_sampling_seed_and_max_tokens(smoke):
    requests = [
        ChatRequest(PROMPT, temperature=0.0, seed=1, max_tokens=12),
        ChatRequest(PROMPT, temperature=0.0, seed=1, max_tokens=12),
        ChatRequest(PROMPT, temperature=1.0, top_p=0.95, seed=2, max_tokens=7),
    ]
    started = time.perf_counter()
    out = smoke.generate(requests)
    wall = time.perf_counter() - started
    assert len(out) == 3 and all(c.ok for c in out), [c.error for c in out]
    assert out[0].text == out[1].text and out[0].text  # same seed, greedy -> same text
    for request, completion in zip(requests, out):
        assert 0 < completion.completion_tokens <= request.max_tokens
        assert completion.prompt_tokens > 10
    # a short poem does not end in 7 tokens: the per-request cap is what stopped it
    assert out[2].completion_tokens == 7 and out[2].finish_reason == "length"
    assert out[0].prompt_tokens == out[1].prompt_tokens == out[2].prompt_tokens
    # decoded together, not one after another: even the quickest request lasted most of the batch
    assert min(c.latency_s for c in out) > 0.4 * wall


def test_seed_reaches_the_sampler(smoke):
    """At temperature 1 the same seed repeats its text and a different seed (almost surely) does not."""
    def make(seed):
        return ChatRequest(PROMPT, temperature=1.0, top_p=1.0, seed=seed, max_tokens=16)

    a, b, c = smoke.generate([make(11), make(11), make(12)])
    assert a.text == b.text
    assert a.text != c.text


def test_stop_sequence(smoke):
    count = (ChatMessage("user", "Count from 1 to 10, one number per line."),)
    (full,) = smoke.generate([ChatRequest(count, temperature=0.0, max_tokens=24)])
    assert "5" in full.text, full.text  # precondition: the model does reach 5
    (stopped,) = smoke.generate([ChatRequest(count, temperature=0.0, max_tokens=24, stop=("5",))])
    assert "5" not in stopped.text and stopped.finish_reason == "stop"
    assert stopped.completion_tokens < full.completion_tokens


def test_count_tokens_and_context(smoke):
    assert smoke.context_length == 1024
    assert smoke.count_tokens("hello world") == 2
    assert smoke.count_tokens("hello world " * 50) > 50


def test_server_timings_sum_llama_cpp_timings_per_call(smoke):
    """`server_timings` adds up llama.cpp's own per-call timings: its token counts match the completions'."""
    t = smoke.server_timings
    before = (t.prompt_tokens, t.predicted_tokens, t.prompt_ms, t.predicted_ms)
    out = smoke.generate([ChatRequest(PROMPT, temperature=0.5, seed=k, max_tokens=8) for k in range(2)])
    assert all(c.ok for c in out)
    assert t.predicted_tokens - before[1] == sum(c.completion_tokens for c in out)
    assert t.prompt_tokens - before[0] == sum(c.prompt_tokens - c.reused_prompt_tokens for c in out)
    assert t.prompt_ms > before[2] and t.predicted_ms > before[3]


def test_overflow_is_an_error_completion_not_a_crash(smoke):
    long = (ChatMessage("user", "hi " * 3000),)
    out = smoke.generate([ChatRequest(long, max_tokens=4), ChatRequest(PROMPT, max_tokens=4)])
    assert out[0].error and "context" in out[0].error and out[0].finish_reason == "error"
    assert out[1].ok and out[1].completion_tokens == 4


def test_streamed_chunks_make_up_one_response_and_errors_stay_errors():
    """`_StreamedChat` (the stream close() can cancel) gives parse_chat_response what a plain call would."""
    closing = threading.Event()
    stream = _StreamedChat(closing)
    for chunk in ({"choices": [{"delta": {"role": "assistant"}}]},
                  {"choices": [{"delta": {"content": "4"}}]},
                  {"choices": [{"delta": {"content": "2"}, "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
                                            "prompt_tokens_details": {"cached_tokens": 5}},
                   "timings": {"prompt_n": 4, "predicted_n": 2}}):
        assert stream.on_chunk(chunk) is False
    c = parse_chat_response(stream.response(), 0.1)
    assert (c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens, c.reused_prompt_tokens) == (
        "42", "length", 9, 2, 5)
    failed = _StreamedChat(closing)
    assert failed.on_chunk({"error": {"code": 400, "message": "the request exceeds the context size"}}) is True
    assert parse_chat_response(failed.response(), 0.1).error == "server error: the request exceeds the context size"
    assert "without a finish reason" in parse_chat_response(_StreamedChat(closing).response(), 0.1).error
    closing.set()
    stopped = _StreamedChat(closing)
    assert stopped.on_chunk({"choices": [{"delta": {"content": "4"}}]}) is True and stopped.cancelled


def test_interleaved_choices_of_one_request_each_make_up_their_own_response():
    """A request for several samples (llama.cpp's n_cmpl) streams its choices interleaved; each choice's usage comes
    in a chunk without choices right after its finishing chunk."""
    stream = _StreamedChat(threading.Event(), n=2)
    for chunk in ({"choices": [{"index": 1, "delta": {"content": "7"}}]},
                  {"choices": [{"index": 0, "delta": {"content": "4"}}]},
                  {"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]},
                  {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}, "timings": {"predicted_n": 1}},
                  {"choices": [{"index": 0, "delta": {"content": "2"}}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}, "timings": {"predicted_n": 2}}):
        assert stream.on_chunk(chunk) is False
    first, second = (parse_chat_response(stream.response(i), 0.1) for i in (0, 1))
    assert (first.text, first.finish_reason, first.completion_tokens) == ("42", "length", 2)
    assert (second.text, second.finish_reason, second.completion_tokens) == ("7", "stop", 1)
    assert stream.response(1)["timings"] == {"predicted_n": 1}
    assert (stream.streamed_tokens(0), stream.streamed_tokens(1)) == (2, 1)  # each corrected by its own usage
    bad = _StreamedChat(threading.Event(), n=2)
    assert bad.on_chunk({"choices": [{"index": 2, "delta": {"content": "x"}}]}) is True
    assert "choice 2" in parse_chat_response(bad.response(0), 0.1).error


def test_only_adjacent_requests_that_differ_in_seeds_counting_up_share_a_prompt():
    base = ChatRequest(PROMPT, seed=10, max_tokens=8, session="d/agent0")
    other = ChatRequest(PROMPT, seed=13, max_tokens=9)
    batch = [base, replace(base, seed=11, session="d/agent1"), replace(base, seed=12), other,
             replace(base, seed=13), replace(base, seed=20), replace(base, seed=21), ChatRequest(PROMPT)]
    assert shared_prompt_runs(batch, limit=9) == [[0, 1, 2], [3], [4], [5, 6], [7]]
    assert shared_prompt_runs(batch[:3], limit=2) == [[0, 1], [2]]  # at most a run per free slot set


def test_consecutive_seeds_are_sampled_from_one_prompt_read(smoke):
    """Requests that differ only in seeds counting up go as one llama.cpp request for that many samples: the prompt
    is read once (the children report it reused), each sample has its own text, finish and log-probabilities."""
    t = smoke.server_timings
    before = t.prompt_tokens
    requests = [ChatRequest(PROMPT, temperature=1.0, top_p=1.0, seed=500 + k, max_tokens=10, logprobs=1)
                for k in range(3)]
    out = smoke.generate(requests)
    assert all(c.ok for c in out), [c.error for c in out]
    assert len({c.text for c in out}) == 3
    assert all(c.logprobs is not None and len(c.logprobs.chosen) == c.completion_tokens for c in out)
    assert [c.reused_prompt_tokens == c.prompt_tokens for c in out] == [False, True, True]
    assert t.prompt_tokens - before == out[0].computed_prompt_tokens  # one prompt read for three samples


def test_missing_gguf_is_a_backend_error(tmp_path):
    with pytest.raises(BackendError, match="not found"):
        LocalLlamaBackend(tmp_path / "nope.gguf")


@pytest.mark.timeout(120)
def test_close_cancels_the_requests_inside_llama_cpp():
    """close() during generation ends the streamed requests at their next token: they come back as CANCELLED
    error completions at once instead of decoding to their token limit (a stopped job used to wait minutes)."""
    pytest.importorskip("xllamacpp")
    backend = make_backend("smoke", n_parallel=2, n_ctx=1024, n_threads=THREADS)
    count = (ChatMessage("user", "Count from 1 to 500, separated by commas."),)
    request = ChatRequest(count, temperature=0.0, max_tokens=900)
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(backend.generate([request, request])))
    worker.start()
    deadline = time.monotonic() + 60
    while backend._in_flight < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # both are inside llama.cpp, past their short prompt
    started = time.perf_counter()
    backend.close()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert [c.error for c in out] == [CANCELLED, CANCELLED] and all(c.finish_reason == "error" for c in out)
    assert time.perf_counter() - started < 10


@pytest.mark.timeout(180)
def test_close_reaches_a_slot_still_reading_its_prompt(monkeypatch):
    """llama.cpp streams prompt-progress chunks, so the callback that cancels runs while a slot reads its prompt
    and close() does not wait for the whole prompt to be read first (timings: bench/bench_stop.py)."""
    pytest.importorskip("xllamacpp")
    before_first_token = threading.Event()
    on_chunk = _StreamedChat.on_chunk

    def spy(self, chunk):
        if isinstance(chunk, dict) and "prompt_progress" in chunk and not self._choices[0].parts:
            before_first_token.set()
        return on_chunk(self, chunk)

    monkeypatch.setattr(_StreamedChat, "on_chunk", spy)
    backend = make_backend("smoke", n_parallel=1, n_ctx=4096, n_threads=THREADS, n_batch=64)
    words = " ".join(f"item{i} apple" for i in range(800))
    request = ChatRequest((ChatMessage("user", f"{words} Summarise the list."),), temperature=0.0, max_tokens=8)
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(backend.generate([request])))
    worker.start()
    assert before_first_token.wait(60), "no prompt-progress chunk before the first token"
    backend.close()
    worker.join(timeout=60)
    assert not worker.is_alive() and [c.error for c in out] == [CANCELLED]


@pytest.mark.timeout(120)
def test_build_and_close_at_once_does_not_hang():
    """Regression: ~Server could hang joining its HTTP thread when destroyed right after construction."""
    pytest.importorskip("xllamacpp")
    for _ in range(3):
        make_backend("smoke", n_parallel=1, n_ctx=128, n_threads=THREADS).close()


def _same_greedy_path(a: str, b: str) -> bool:
    """Similar replies, or one the start of the other: a near-tie flip between stopping and going on (seen with
    the 135M model: one copy vs the copy repeated until the limit) leaves the shared part identical."""
    a, b = a.strip(), b.strip()
    return difflib.SequenceMatcher(None, a, b).ratio() > 0.6 or (min(len(a), len(b)) >= 20
                                                                   and (a.startswith(b) or b.startswith(a)))


def test_speculative_decoding_keeps_the_answers_and_drafts_from_the_context():
    """Draftless speculation (ngram-simple) on the real smoke GGUF: a reply that copies its prompt is drafted
    from it and accepted, and greedy replies match the ones decoding without it gives (each position is still the
    model's own choice). Verifying drafts in a batch changes the logits in the last bits, which can flip a
    near-tie of this tiny model (seen in about 1 run of 3), so the match is by similarity or a shared start, not identity; sampled
    replies are only checked to work."""
    pytest.importorskip("xllamacpp")
    text = ("The farmer counts 17 apples, 23 pears and 41 plums, then sells half of the apples and a third of "
            "the plums at the market near the river. ") * 3
    asks = ("Copy this text exactly:\n", "Repeat the following, word for word:\n", "Write this out again:\n")
    requests = [ChatRequest((ChatMessage("user", ask + text),), temperature=0.0, seed=11, max_tokens=96)
                for ask in asks]
    requests.append(ChatRequest((ChatMessage("user", asks[0] + text),), temperature=0.8, seed=5, max_tokens=64))
    texts = {}
    for kind in (None, "ngram-simple"):
        backend = make_backend("smoke", n_parallel=3, n_ctx=1024, n_threads=THREADS, speculative=kind)
        try:
            out = backend.generate(requests)
            assert all(c.ok for c in out), [c.error for c in out]
            texts[kind] = [c.text for c in out[:3]]
            stats = backend.server_timings
        finally:
            backend.close()
    for with_spec, without in zip(texts["ngram-simple"], texts[None]):
        assert _same_greedy_path(with_spec, without), (with_spec, without)
    assert stats.drafted > 0 and 0 < stats.accepted <= stats.drafted
    with pytest.raises(ValueError, match="speculative must be one of"):
        make_backend("smoke", n_parallel=1, n_ctx=256, n_threads=THREADS, speculative="eagle")


def test_score_reproduces_the_live_log_probabilities():
    """Teacher forcing a sampled reply gives back exactly the log-probabilities the model reported while sampling
    it, when both decode one request at a time (a batch of slots moves them: tests/eval/test_score_confidence.py)."""
    single = make_backend("smoke", n_parallel=1, n_ctx=1024, n_threads=THREADS, repeatable=True)
    try:
        requests = [ChatRequest(PROMPT, temperature=0.9, top_p=0.95, seed=s, max_tokens=24, logprobs=3)
                    for s in (1, 2, 3)]
        live = single.generate(requests)
        scored = single.score(requests, [c.text for c in live])
    finally:
        single.close()
    assert all(c.ok for c in live + scored), [c.error for c in live + scored]
    for a, b in zip(live, scored):
        assert b.text == a.text and b.completion_tokens == len(b.logprobs.chosen)
        if b.logprobs.nbytes == a.logprobs.nbytes:  # the tokenizer split the text as the model sampled it
            assert b.logprobs.chosen == pytest.approx(a.logprobs.chosen, abs=1e-5)
            assert [x for t in b.logprobs.top for x in t] == pytest.approx([x for t in a.logprobs.top for x in t], abs=1e-5)
    assert sum(b.logprobs.nbytes == a.logprobs.nbytes for a, b in zip(live, scored)) >= 2


def test_score_needs_log_probabilities_asked_for(smoke):
    with pytest.raises(ValueError, match="log-probabilities"):
        smoke.score([ChatRequest(PROMPT)], ["The sea."])
    with pytest.raises(ValueError, match="1 requests for 2 texts"):
        smoke.score([ChatRequest(PROMPT, logprobs=1)], ["a", "b"])
