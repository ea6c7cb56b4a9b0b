"""A stand-in for the `vllm` module (test double), following vLLM 0.33.0's public signatures.

Read from the vllm-0.33.0 sdist on PyPI: `vllm/entrypoints/llm.py` (`LLM.__init__`, `LLM.chat`,
`LLM.generate`, `LLM.get_tokenizer`, `llm.llm_engine.model_config`), `vllm/outputs.py` (`RequestOutput`,
`CompletionOutput`), `vllm/sampling_params.py` (`SamplingParams` fields, defaults and `_verify_args` ranges),
`vllm/engine/arg_utils.py` (`EngineArgs.enable_prefix_caching`). Same names, parameter kinds (keyword-only
where vLLM has them) and defaults, so a call the real vLLM would reject with a TypeError or a validation
error is rejected here too. The "model" echoes: its completion is the words of the last user message,
cut at `max_tokens` words (finish_reason "length") or ending with "stop" otherwise.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

VLLM_VERSION = "0.33.0"
__version__ = VLLM_VERSION

# EngineArgs fields the DEAR backend may pass through LLM(**kwargs) (all exist in vLLM 0.33.0's EngineArgs);
# anything else raises TypeError, as EngineArgs(**kwargs) does.
ENGINE_KWARGS = {"enable_prefix_caching", "max_model_len", "max_num_seqs", "disable_log_stats"}


class VLLMValidationError(ValueError):
    """vllm.exceptions.VLLMValidationError is a ValueError subclass."""


class SamplingParams:
    """The SamplingParams fields DEAR uses, keyword-only like the msgspec Struct, with vLLM's defaults/checks."""

    def __init__(self, *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 min_p: float = 0.0, seed: int | None = None, stop: str | list[str] | None = None,
                 max_tokens: int | None = 16, min_tokens: int = 0, logprobs: int | None = None,
                 prompt_logprobs: int | None = None):
        self.logprobs, self.prompt_logprobs = logprobs, prompt_logprobs
        self.n, self.temperature, self.top_p, self.top_k, self.min_p = n, temperature, top_p, top_k, min_p
        self.seed, self.max_tokens, self.min_tokens = seed, max_tokens, min_tokens
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])  # __post_init__ normalises to a list
        if not 0.0 <= temperature <= 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {temperature}.")
        if not 0.0 < top_p <= 1.0:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {top_p}.")
        if max_tokens is not None and max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {max_tokens}.")
        if seed is not None and not isinstance(seed, int):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: Sequence[int]
    cumulative_logprob: float | None
    logprobs: Any | None
    routed_experts: Any | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any | None = None
    sampling_mask: Any | None = None
    spec_decode_metrics: Any | None = None
    weight_versions: list | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int] | None,
                 prompt_logprobs: Any | None, outputs: list[CompletionOutput], finished: bool,
                 metrics: Any | None = None, lora_request: Any | None = None, encoder_prompt: str | None = None,
                 encoder_prompt_token_ids: list[int] | None = None, num_cached_tokens: int | None = None,
                 num_cache_creation_tokens: int | None = None, *, prompt_token_id_logprobs: Any | None = None,
                 kv_transfer_params: dict[str, Any] | None = None, ec_transfer_params: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        self.request_id, self.prompt, self.prompt_token_ids = request_id, prompt, prompt_token_ids
        self.prompt_logprobs, self.outputs, self.finished = prompt_logprobs, outputs, finished
        self.metrics, self.num_cached_tokens = metrics, num_cached_tokens


@dataclass
class Logprob:
    """vllm/logprobs.py: one token's log-probability, its rank in the vocabulary and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class _Tokenizer:
    """Whitespace 'tokenizer' with a deterministic id per word."""

    def __init__(self) -> None:
        self.words: dict[int, str] = {}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = []
        for w in text.split():
            ids.append(zlib.crc32(w.encode()) % 50_000)
            self.words[ids[-1]] = w
        return ([1] if add_special_tokens else []) + ids

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.words.get(i, "?") for i in ids)

    def apply_chat_template(self, conversation: list[dict], tools: list[dict] | None = None,
                            documents: list[dict] | None = None, chat_template: str | None = None,
                            add_generation_prompt: bool = False, continue_final_message: bool = False,
                            tokenize: bool = True, **kwargs: Any) -> str | list[int]:
        """The stand-in's chat template, the one `LLM.chat` renders (transformers' keyword names)."""
        text = _template(conversation) + ("<|assistant|>" if add_generation_prompt else "")
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _template(conversation: list[dict]) -> str:
    return "".join(f"<|{m['role']}|>{m['content']}\n" for m in conversation)


def _logprobs(token_ids: Sequence[int], k: int) -> list[dict[int, Logprob]]:
    """Per position: the sampled token (rank 2, log-prob -0.5) beside the k most likely (rank 1 = a token id of
    its own at -0.25, then ranks 3.. at -2, -3, ...), as vLLM returns top-k plus the sampled token."""
    out = []
    for tid in token_ids:
        position = {tid: Logprob(-0.5, 2, "w")}
        alternatives = [(50_001, Logprob(-0.25, 1, "a"))] + [(50_001 + r, Logprob(-float(r), r + 1, "b"))
                                                              for r in range(2, k)]
        position.update({a: lp for a, lp in alternatives[:k] if a != tid})
        out.append(position)
    return out


class LLM:
    instances: list["LLM"] = []

    def __init__(self, model: str, *, tokenizer: str | None = None, trust_remote_code: bool = False,
                 tensor_parallel_size: int = 1, dtype: str = "auto", quantization: str | None = None,
                 seed: int = 0, gpu_memory_utilization: float = 0.92, enforce_eager: bool = False,
                 **kwargs: Any) -> None:
        unknown = set(kwargs) - ENGINE_KWARGS
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        self.model = model
        self.init_kwargs = {"tensor_parallel_size": tensor_parallel_size, "dtype": dtype, "seed": seed,
                            "gpu_memory_utilization": gpu_memory_utilization, **kwargs}
        max_len = kwargs.get("max_model_len") or 32_768
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_len))
        self.model_config = self.llm_engine.model_config
        self.chat_calls: list[tuple[list, list[SamplingParams]]] = []
        self.fail_next: Exception | None = None
        self._seen_prompts: list[list[int]] = []  # for num_cached_tokens under prefix caching
        LLM.instances.append(self)

    _tokenizer = _Tokenizer()  # one per process: it remembers the words it encoded, for decode

    def get_tokenizer(self) -> _Tokenizer:
        return LLM._tokenizer

    def chat(self, messages: list[dict] | Sequence[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool | Callable[..., Any] = True, lora_request: Any | None = None,
             priority: int | Sequence[int] | None = None, chat_template: str | None = None,
             chat_template_content_format: str = "auto", add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list[dict[str, Any]] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None, tokenization_kwargs: dict[str, Any] | None = None,
             mm_processor_kwargs: dict[str, Any] | None = None) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        for conv in conversations:
            for m in conv:
                if set(m) - {"role", "content"} or m.get("role") not in ("system", "user", "assistant"):
                    raise ValueError(f"not an OpenAI chat message: {m!r}")
        prompts = [_template(conv) + "<|assistant|>" for conv in conversations]
        return self._run(prompts, [conv[-1]["content"] for conv in conversations], sampling_params, "chat")

    def generate(self, prompts: str | dict | Sequence[str | dict], sampling_params: SamplingParams
                 | Sequence[SamplingParams] | None = None, *, use_tqdm: bool | Callable[..., Any] = True,
                 lora_request: Any | None = None, priority: int | Sequence[int] | None = None,
                 tokenization_kwargs: dict[str, Any] | None = None,
                 mm_processor_kwargs: dict[str, Any] | None = None) -> list[RequestOutput]:
        """Text prompts, or TokensPrompt dicts ({"prompt_token_ids": [...]}, vllm/inputs/llm.py)."""
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        ids = [list(p["prompt_token_ids"]) if isinstance(p, dict) else None for p in prompts]
        texts = [self.get_tokenizer().decode(i) if i is not None else p for p, i in zip(prompts, ids)]
        return self._run(texts, texts, sampling_params, "generate", ids)

    def _run(self, prompts: list[str], sources: list[str], sampling_params, kind: str,
             prompt_ids: list[list[int] | None] | None = None) -> list[RequestOutput]:
        if sampling_params is None:
            params = [SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):  # LLM._validate_and_add_requests
                raise ValueError("The lengths of prompts and sampling_params must be the same.")
        self.chat_calls.append((prompts, params))
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        tok = self.get_tokenizer()
        outputs = []
        for k, (prompt, source, sp) in enumerate(zip(prompts, sources, params)):
            words = source.split()
            cut = words[: sp.max_tokens] if sp.max_tokens is not None else words
            stopped = next((i for i, w in enumerate(cut) if w in sp.stop), None)
            if stopped is not None:
                cut, finish, stop_reason = cut[:stopped], "stop", cut[stopped]
            else:
                finish = "length" if len(cut) < len(words) else "stop"
                stop_reason = None
            text = " ".join(cut)
            token_ids = tok.encode(text, add_special_tokens=False)
            completion = CompletionOutput(index=0, text=text, token_ids=token_ids, cumulative_logprob=None,
                                          logprobs=None if sp.logprobs is None else _logprobs(token_ids, sp.logprobs),
                                          finish_reason=finish,
                                          stop_reason=stop_reason)
            given = prompt_ids[k] if prompt_ids else None
            ids = given if given is not None else tok.encode(prompt)
            # vllm/logprobs.py create_prompt_logprobs: the first prompt token has none
            prompt_lp = None if sp.prompt_logprobs is None else [None] + _logprobs(ids[1:], sp.prompt_logprobs)
            outputs.append(RequestOutput(str(k), prompt, ids, prompt_lp, [completion], True,
                                         num_cached_tokens=self._cached_prefix(ids)))
            self._seen_prompts.append(ids)
        return outputs

    def _cached_prefix(self, ids: list[int]) -> int:
        """Automatic prefix caching, simplified: the longest prefix shared with an earlier prompt (vLLM counts
        whole KV blocks; a token count is enough for the backend's accounting)."""
        if not self.init_kwargs.get("enable_prefix_caching"):
            return 0
        best = 0
        for seen in self._seen_prompts:
            n = 0
            for a, b in zip(seen, ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best
