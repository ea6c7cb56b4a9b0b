"""VLLMBackend: a clear error without vllm/CUDA here; a real run on a GPU machine."""

from __future__ import annotations

import importlib.util

import pytest

from dear.llm import BackendError, ChatMessage, ChatRequest
from dear.llm.vllm_backend import VLLMBackend, cuda_available

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


def test_plumbing_with_a_stand_in_vllm(monkeypatch):
    """Test double for the `vllm` module: checks one SamplingParams per request and the output mapping."""
    import sys
    import types

    from dear.llm import vllm_backend

    seen = {}

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class Tokenizer:
        def encode(self, text, add_special_tokens=True):
            return text.split()

    class LLM:
        def __init__(self, model, **kw):
            seen["init"] = (model, kw)
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=1234))

        def get_tokenizer(self):
            return Tokenizer()

        def chat(self, conversations, sampling_params, use_tqdm):
            seen["chat"] = (conversations, [s.kw for s in sampling_params])
            return [
                types.SimpleNamespace(
                    prompt_token_ids=list(range(10 + i)),
                    outputs=[
                        types.SimpleNamespace(text=f"out{i}", token_ids=[1] * (i + 1), finish_reason="length")
                    ],
                )
                for i in range(len(conversations))
            ]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    monkeypatch.setattr(vllm_backend, "cuda_available", lambda: True)
    backend = vllm_backend.VLLMBackend("some/model", tensor_parallel_size=2)
    assert seen["init"] == ("some/model", {"tensor_parallel_size": 2})
    assert backend.model_id == "vllm:some/model" and backend.context_length == 1234
    msgs = (ChatMessage("system", "s"), ChatMessage("user", "u"))
    out = backend.generate(
        [ChatRequest(msgs, temperature=0.3, top_p=0.8, max_tokens=9, seed=5, stop=("X",)), ChatRequest(msgs)]
    )
    conversations, params = seen["chat"]
    assert conversations[0] == [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert params[0] == {"temperature": 0.3, "top_p": 0.8, "max_tokens": 9, "seed": 5, "stop": ["X"]}
    assert params[1]["seed"] is None and params[1]["stop"] is None and params[1]["temperature"] == 0.7
    assert [(c.text, c.prompt_tokens, c.completion_tokens, c.finish_reason) for c in out] == [
        ("out0", 10, 1, "length"),
        ("out1", 11, 2, "length"),
    ]
    assert backend.count_tokens("a b c") == 3
