"""vLLM in-process (the GPU path): one `LLM.chat` call per batch with one SamplingParams per request; stored texts
scored by one prefill (`VLLMBackend.score`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from dear.llm.base import Backend, BackendError, ChatRequest, Completion, TokenLogprobs, count_generated

log = logging.getLogger(__name__)

_GPU_HINT = "install the `gpu` extra on a CUDA machine: pip install -e .[gpu]"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class VLLMBackend(Backend):
    """`vllm.LLM(model, enable_prefix_caching=..., **engine_kwargs)`; the model's chat template formats messages.

    vLLM batches the whole list continuously on the GPU, so a round of all debates and agents is one call.
    Prefix caching is on by default: in the multi-turn layout each agent's prompt extends its previous one, and
    all prompts share the system prompt and question, so those KV blocks are computed once; the reused count
    comes back per call (`Completion.reused_prompt_tokens`, from `RequestOutput.num_cached_tokens`). Written against vLLM 0.33 (the `gpu` extra's
    pin; tests/dear/llm/vllm_stand_in.py mirrors its signatures).
    Typical engine_kwargs: tensor_parallel_size, gpu_memory_utilization, max_model_len, dtype, seed.
    """

    def __init__(self, model: str, enable_prefix_caching: bool = True, **engine_kwargs: Any):
        try:
            import vllm
        except ImportError as exc:
            raise BackendError(f"vllm is not installed ({exc}); {_GPU_HINT}") from exc
        if not cuda_available():
            raise BackendError(f"vLLM needs a CUDA GPU and torch.cuda.is_available() is False; {_GPU_HINT}")
        self._vllm = vllm
        started = time.perf_counter()
        try:
            self._llm = vllm.LLM(model=model, enable_prefix_caching=enable_prefix_caching, **engine_kwargs)
        except Exception as exc:  # vLLM raises many types (ValueError, RuntimeError, OSError, CUDA errors)
            raise BackendError(f"vLLM could not load {model!r}: {type(exc).__name__}: {exc}") from exc
        log.info("vLLM loaded %s in %.1fs", model, time.perf_counter() - started)
        self._tokenizer = self._llm.get_tokenizer()
        self.model_id = f"vllm:{model}"
        try:
            self.context_length = int(self._llm.llm_engine.model_config.max_model_len)
        except AttributeError:  # engine internals moved between vLLM versions
            self.context_length = engine_kwargs.get("max_model_len")

    def _sampling(self, request: ChatRequest):
        return self._vllm.SamplingParams(
            temperature=request.temperature,
            top_p=request.top_p,
            max_tokens=request.max_tokens,
            seed=request.seed,
            stop=list(request.stop) or None,
            logprobs=request.logprobs,  # None: none; k: the sampled token's and the k most likely
        )

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        if not requests:
            return []
        conversations = [[{"role": m.role, "content": m.content} for m in r.messages] for r in requests]
        started = time.perf_counter()
        try:
            outputs = self._llm.chat(
                conversations, sampling_params=[self._sampling(r) for r in requests], use_tqdm=False
            )
        except Exception as exc:  # noqa: BLE001 - one failed batch must not crash the debates
            latency = time.perf_counter() - started
            log.error("vLLM batch of %d failed: %s", len(requests), exc)
            return [
                Completion("", 0, 0, "error", latency, error=f"vLLM: {type(exc).__name__}: {exc}")
                for _ in requests
            ]
        latency = time.perf_counter() - started  # vLLM decodes the batch together: one wall time for all
        completions = []
        for req, out in zip(requests, outputs):
            gen = out.outputs[0]
            completions.append(
                Completion(
                    text=gen.text,
                    prompt_tokens=len(out.prompt_token_ids or []),
                    completion_tokens=len(gen.token_ids),
                    finish_reason=gen.finish_reason or "stop",
                    latency_s=latency,
                    # automatic prefix caching: prompt tokens whose KV blocks were reused
                    reused_prompt_tokens=int(getattr(out, "num_cached_tokens", 0) or 0),
                    logprobs=vllm_token_logprobs(gen, self._tokenizer, req.logprobs),
                )
            )
        return count_generated(completions)

    def score(self, requests: Sequence[ChatRequest], texts: Sequence[str]) -> list[Completion]:
        """Teacher forcing (`Backend.score`) in one prefill: each request's chat-templated prompt followed by its
        text's tokens (the tokenizer's own split) is read as a prompt with `prompt_logprobs=k`, so vLLM reports the
        log-probability of every text token given what precedes it, and the k most likely, as it does while sampling
        (raw log-probabilities, before temperature and top-p). One generated token per request is discarded. Costs a
        prompt read, not a generation."""
        if len(requests) != len(texts):
            raise ValueError(f"score: {len(requests)} requests for {len(texts)} texts")
        if any(r.logprobs is None for r in requests):
            raise ValueError("score: every request must ask for log-probabilities (ChatRequest.logprobs = k)")
        if self._llm is None:
            raise BackendError("VLLMBackend is closed")
        if not requests:
            return []
        heads = [self._prompt_ids(r) for r in requests]
        bodies = [self._tokenizer.encode(t, add_special_tokens=False) for t in texts]
        todo = [i for i, b in enumerate(bodies) if b]
        out: list[Completion] = [Completion("", 0, 0, "error", 0.0, error="nothing to score: the stored text has no "
                                            "tokens") for _ in requests]
        started = time.perf_counter()
        try:
            outputs = self._llm.generate(
                [{"prompt_token_ids": heads[i] + bodies[i]} for i in todo],
                sampling_params=[self._vllm.SamplingParams(temperature=0.0, max_tokens=1,
                                                           prompt_logprobs=requests[i].logprobs) for i in todo],
                use_tqdm=False)
        except Exception as exc:  # noqa: BLE001 - one failed batch must not crash the caller
            latency = time.perf_counter() - started
            log.error("vLLM scoring batch of %d failed: %s", len(todo), exc)
            return [Completion("", 0, 0, "error", latency, error=f"vLLM: {type(exc).__name__}: {exc}")
                    for _ in requests]
        latency = time.perf_counter() - started
        for i, result in zip(todo, outputs):
            positions = list(result.prompt_logprobs or [])[len(heads[i]):]
            logprobs = token_logprobs(bodies[i], positions, self._tokenizer, requests[i].logprobs)
            out[i] = Completion(text=texts[i], prompt_tokens=len(heads[i]), completion_tokens=len(bodies[i]),
                                finish_reason="stop", latency_s=latency, logprobs=logprobs) if logprobs else \
                Completion("", 0, 0, "error", latency, error="vLLM returned no prompt log-probabilities")
        return out

    def _prompt_ids(self, request: ChatRequest) -> list[int]:
        """The token ids `LLM.chat` reads for the request's messages: the chat template rendered (with the assistant
        turn opened), then tokenized without added special tokens, as vLLM's chat path does."""
        conversation = [{"role": m.role, "content": m.content} for m in request.messages]
        text = self._tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def close(self) -> None:
        self._llm = None


def vllm_token_logprobs(gen, tokenizer, k: int | None) -> TokenLogprobs | None:
    """A generated sequence's log-probabilities (`CompletionOutput.logprobs`) as TokenLogprobs."""
    return token_logprobs(gen.token_ids, getattr(gen, "logprobs", None), tokenizer, k)


def token_logprobs(token_ids: Sequence[int], positions, tokenizer, k: int | None) -> TokenLogprobs | None:
    """vLLM's per-position `{token_id: Logprob}` maps (of sampled tokens, or of prompt tokens with
    `prompt_logprobs`) as TokenLogprobs: each map holds the k most likely tokens (rank 1..k) and the token at that
    position (rank > k when it is not among them)."""
    if k is None or not positions:
        return None
    chosen, top, nbytes = [], [], []
    for token_id, alternatives in zip(token_ids, positions):
        chosen.append(float(alternatives[token_id].logprob))
        ranked = sorted((lp for lp in alternatives.values() if lp.rank is not None and lp.rank <= k),
                        key=lambda lp: lp.rank)
        top.append(tuple(float(lp.logprob) for lp in ranked))
        nbytes.append(len(tokenizer.decode([token_id]).encode("utf-8")))
    return TokenLogprobs(tuple(chosen), tuple(top), tuple(nbytes))
