"""VLLMBackend: a clear error without vllm/CUDA here; its code driven through a stand-in `vllm` (vLLM 0.33.0
signatures) in CI; a real run on a GPU machine."""

from __future__ import annotations

import importlib.util
import sys
import tomllib

import pytest

from dear.llm import BackendError, ChatMessage, ChatRequest
from dear.llm.registry import make_backend
from dear.llm.vllm_backend import VLLMBackend, cuda_available
from tests import ROOT

HAVE_GPU = importlib.util.find_spec("vllm") is not None and cuda_available()


@pytest.mark.skipif(HAVE_GPU, reason="this machine has vllm and CUDA")
def test_clear_error_without_gpu_or_vllm():
    with pytest.raises(BackendError, match=r"gpu"):
        VLLMBackend("Qwen/Qwen2.5-0.5B-Instruct")


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs vllm and a CUDA GPU")
def test_real_vllm_batch():
    backend = VLLMBackend("Qwen/Qwen2.5-0.5B-Instruct", gpu_memory_utilization=0.5, max_model_len=2048)
    poem = (ChatMessage("user", "Write a short poem about the sea."),)
    out = backend.generate(
        [
            ChatRequest(poem, temperature=0.0, seed=1, max_tokens=16),
            ChatRequest(poem, temperature=0.0, seed=1, max_tokens=16),
            ChatRequest(poem, temperature=1.0, seed=2, max_tokens=5),
        ]
    )
    assert all(c.ok for c in out)
    assert out[0].text == out[1].text
    assert out[2].completion_tokens == 5 and out[2].finish_reason == "length"
    assert all(c.prompt_tokens > 5 for c in out)
    assert backend.count_tokens("hello world") >= 2 and backend.context_length == 2048
    # teacher forcing on the same model: the greedy reply scored equals its live log-probabilities
    live = backend.generate([ChatRequest(poem, temperature=0.0, seed=1, max_tokens=16, logprobs=3)])[0]
    [scored] = backend.score([ChatRequest(poem, logprobs=3)], [live.text])
    assert scored.ok and scored.completion_tokens == live.completion_tokens
    assert scored.logprobs.chosen == pytest.approx(live.logprobs.chosen, abs=0.05)


# ---------------------------------------------------------------------------------------------------
# The in-process GPU path's code, driven through a stand-in `vllm` module that follows vLLM 0.33.0's
# signatures (tests/dear/llm/vllm_stand_in.py names what it was read from).


@pytest.fixture
def stand_in(monkeypatch):
    from dear.llm import vllm_backend
    from tests.dear.llm import vllm_stand_in

    vllm_stand_in.LLM.instances.clear()
    monkeypatch.setitem(sys.modules, "vllm", vllm_stand_in)
    monkeypatch.setattr(vllm_backend, "cuda_available", lambda: True)
    return vllm_stand_in


def test_stand_in_version_is_the_pinned_one():
    from packaging.requirements import Requirement

    from tests.dear.llm.vllm_stand_in import VLLM_VERSION

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [req] = [Requirement(r) for r in data["project"]["optional-dependencies"]["gpu"] if r.startswith("vllm")]
    assert VLLM_VERSION == "0.33.0"
    assert req.specifier.contains(VLLM_VERSION)
    assert not req.specifier.contains("0.34.0") and not req.specifier.contains("0.32.0")  # pinned both ways


def test_backend_through_the_stand_in(stand_in):
    backend = make_backend("vllm:some/model", tensor_parallel_size=2, max_model_len=4096)
    [llm] = stand_in.LLM.instances
    assert llm.model == "some/model"
    assert llm.init_kwargs["enable_prefix_caching"] is True  # on by default
    assert llm.init_kwargs["tensor_parallel_size"] == 2
    assert backend.model_id == "vllm:some/model" and backend.context_length == 4096
    msgs = (ChatMessage("system", "be brief"), ChatMessage("user", "a b c d e"))
    out = backend.generate([
        ChatRequest(msgs, temperature=0.3, top_p=0.8, max_tokens=3, seed=5, stop=("X",)),
        ChatRequest((ChatMessage("user", "one two X three"),), max_tokens=50, stop=("X",)),
        ChatRequest((ChatMessage("user", "short"),)),
    ])
    prompts, params = llm.chat_calls[-1]
    assert len(prompts) == 3 and len(params) == 3  # one chat() call, one SamplingParams per request
    assert prompts[0].startswith("<|system|>be brief\n<|user|>a b c d e")
    p = params[0]
    assert (p.temperature, p.top_p, p.max_tokens, p.seed, p.stop) == (0.3, 0.8, 3, 5, ["X"])
    assert params[2].seed is None and params[2].stop == [] and params[2].temperature == 0.7
    assert [(c.text, c.completion_tokens, c.finish_reason) for c in out] == [
        ("a b c", 3, "length"), ("one two", 2, "stop"), ("short", 1, "stop")]
    tok = llm.get_tokenizer()
    assert [c.prompt_tokens for c in out] == [len(tok.encode(x)) for x in prompts]
    assert all(c.ok and c.latency_s >= 0 for c in out)
    assert backend.count_tokens("a b c") == 3
    assert backend.generate([]) == []


def test_prefix_caching_is_configurable(stand_in):
    make_backend("vllm:m", enable_prefix_caching=False)
    assert stand_in.LLM.instances[-1].init_kwargs["enable_prefix_caching"] is False


def test_failed_batch_returns_errors_and_bad_engine_args_raise(stand_in):
    backend = VLLMBackend("m")
    stand_in.LLM.instances[-1].fail_next = RuntimeError("CUDA out of memory")
    out = backend.generate([ChatRequest((ChatMessage("user", "q"),)), ChatRequest((ChatMessage("user", "r"),))])
    assert [c.finish_reason for c in out] == ["error", "error"]
    assert all("CUDA out of memory" in c.error for c in out)
    with pytest.raises(BackendError, match=r"could not load 'm'.*no_such_engine_arg"):
        VLLMBackend("m", no_such_engine_arg=1)


def test_a_debate_runs_on_the_in_process_path(stand_in):
    """The engine -> VLLMBackend -> vllm.LLM.chat path end to end (the echo model gives no real answers)."""
    from dear.debate.engine import DebateConfig, DebateEngine
    from dear.debate.protocols import make_protocol
    from dear.tasks import load

    cfg = DebateConfig(n_agents=3, n_rounds=1, max_tokens=64)
    debates = DebateEngine(make_backend("vllm:m"), cfg).run(load("gsm8k", "test", n=2), make_protocol("mad", cfg))
    assert all(d.finished and not d.failed for d in debates)
    [llm] = stand_in.LLM.instances
    assert len(llm.chat_calls) == 2  # round 0 and round 1, each ONE batched call for both debates
    assert all(len(prompts) == 2 * 3 for prompts, _ in llm.chat_calls)
    assert all(t.completion_tokens > 0 for d in debates for rnd in d.trace.rounds for t in rnd)


def test_multiturn_debate_reports_prefix_cache_reuse(stand_in):
    """In the multi-turn layout an agent's round-1 prompt extends its round-0 prompt, so vLLM's prefix cache
    serves that part; the backend reports it per call and the trace keeps it."""
    from dear.debate.engine import DebateConfig, DebateEngine
    from dear.debate.protocols import make_protocol
    from dear.tasks import load

    cfg = DebateConfig(n_agents=3, n_rounds=1, max_tokens=64, layout="multiturn")
    (d,) = DebateEngine(make_backend("vllm:m"), cfg).run(load("gsm8k", "test", n=1), make_protocol("mad", cfg))
    round0, round1 = d.trace.rounds
    assert round0[0].reused_prompt_tokens == 0  # nothing cached yet
    # Agent 0's round-1 prompt: its round-0 prompt is cached, the peers' turn is new. (The echo model makes the
    # other agents' prompts identical to agent 0's, so theirs are served whole from the cache.)
    assert 0 < round1[0].reused_prompt_tokens < round1[0].prompt_tokens
    assert all(t.reused_prompt_tokens > 0 for t in round1)
    assert all(t.computed_prompt_tokens == t.prompt_tokens - t.reused_prompt_tokens for t in round1)


def test_log_probabilities_through_the_stand_in(stand_in):
    """SamplingParams(logprobs=k): per position the k most likely (rank <= k) and the sampled token."""
    backend = make_backend("vllm:some/model")
    msg = (ChatMessage("user", "a bb c"),)
    asked, plain = backend.generate([ChatRequest(msg, logprobs=3), ChatRequest(msg)])
    [llm] = stand_in.LLM.instances
    assert [p.logprobs for p in llm.chat_calls[-1][1]] == [3, None]
    assert plain.logprobs is None
    lp = asked.logprobs
    assert lp.chosen == (-0.5, -0.5, -0.5) and lp.nbytes == (1, 2, 1)
    assert all(t == (-0.25, -0.5, -2.0) for t in lp.top)  # ranks 1..3, the sampled token at rank 2


def test_stored_text_is_scored_in_one_prefill_through_the_stand_in(stand_in):
    """score(): the chat-templated prompt then the text's tokens, read with prompt_logprobs=k; the text's positions
    become its record (the prompt's are dropped), one generated token discarded."""
    backend = make_backend("vllm:some/model")
    msgs = (ChatMessage("system", "be brief"), ChatMessage("user", "what is two"))
    scored, empty = backend.score([ChatRequest(msgs, logprobs=3), ChatRequest(msgs, logprobs=3)], ["it is 2", ""])
    [llm] = stand_in.LLM.instances
    prompts, params = llm.chat_calls[-1]
    assert len(prompts) == 1 and (params[0].prompt_logprobs, params[0].max_tokens, params[0].temperature) == (3, 1, 0.0)
    tok = llm.get_tokenizer()
    head = tok.encode("<|system|>be brief\n<|user|>what is two\n<|assistant|>", add_special_tokens=False)
    assert scored.ok and scored.text == "it is 2" and scored.prompt_tokens == len(head)
    assert scored.completion_tokens == 3 and scored.logprobs.chosen == (-0.5, -0.5, -0.5)
    assert all(t == (-0.25, -0.5, -2.0) for t in scored.logprobs.top) and scored.logprobs.nbytes == (2, 2, 1)
    assert not empty.ok and "no tokens" in empty.error
    with pytest.raises(ValueError, match="must ask for log-probabilities"):
        backend.score([ChatRequest(msgs)], ["x"])
    llm.fail_next = RuntimeError("CUDA out of memory")
    [failed] = backend.score([ChatRequest(msgs, logprobs=3)], ["it is 2"])
    assert not failed.ok and "CUDA out of memory" in failed.error
