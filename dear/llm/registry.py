"""`make_backend(spec)`: one string picks the LLM backend (CLI flags, configs, per-agent model mixes)."""

from __future__ import annotations

from dear.llm.base import Backend

SPECS = {
    "local": "the embedded Qwen2.5-Coder-1.5B-Instruct Q4_K_M through llama.cpp (CPU)",
    "local:/path/model.gguf": "any GGUF file through llama.cpp",
    "smoke": "SmolLM2-135M-Instruct through llama.cpp (fast, for tests)",
    "openai:http://host:port/v1[#model]": "any OpenAI-compatible chat-completions server",
    "vllm:<hf model id or path>": "vLLM in-process on a CUDA GPU",
    "sim": "synthetic debaters (no LLM)",
    "bank[:DIR]": "a sample bank's real samples replayed (dear/bank; default: the embedded model's committed bank)",
}


def _unknown(spec: str, why: str) -> ValueError:
    return ValueError(f"unknown LLM backend spec {spec!r} ({why}); valid: {' | '.join(SPECS)}")


def check_spec(spec: str) -> str:
    """The spec, stripped, if its form is one `make_backend` accepts (nothing is imported or loaded: CLIs call
    it while parsing flags); ValueError naming the spec and the valid forms otherwise."""
    kind, sep, rest = spec.strip().partition(":")
    if kind in ("smoke", "sim") and sep:
        raise _unknown(spec, f"{kind} takes no argument")
    if kind in ("openai", "vllm") and not rest.partition("#")[0]:
        raise _unknown(spec, "openai needs a base URL" if kind == "openai" else "vllm needs a model id or path")
    if kind not in ("local", "smoke", "sim", "openai", "vllm", "bank"):
        raise _unknown(spec, f"unrecognised kind {kind!r}")
    return spec.strip()


def make_backend(spec: str, **kwargs) -> Backend:
    """Build a backend from a spec string; kwargs go to the backend's constructor."""
    kind, _, rest = check_spec(spec).partition(":")
    if kind == "local":
        from dear.llm.local import LocalLlamaBackend
        from dear.llm.model_files import embedded_model_path

        if rest:
            return LocalLlamaBackend(rest, **kwargs)
        return LocalLlamaBackend(
            embedded_model_path(), model_id="local:qwen2.5-coder-1.5b-instruct-q4_k_m", **kwargs
        )
    if kind == "smoke":
        from dear.llm.local import LocalLlamaBackend
        from dear.llm.model_files import smoke_model_path

        kwargs.setdefault("n_ctx", 2048)
        return LocalLlamaBackend(smoke_model_path(), model_id="smoke:smollm2-135m-instruct-q4_1", **kwargs)
    if kind == "openai":
        from dear.llm.openai_compat import OpenAICompatBackend

        url, _, model = rest.partition("#")
        return OpenAICompatBackend(url, model=model or kwargs.pop("model", None), **kwargs)
    if kind == "vllm":
        from dear.llm.vllm_backend import VLLMBackend

        return VLLMBackend(rest, **kwargs)
    if kind == "bank":  # options: benchmark, split, profile, max_tokens, live (a backend), grow, seed
        from dear.bank.backend import DEFAULT_BANK, BankBackend

        return BankBackend(rest or DEFAULT_BANK, **kwargs)
    from dear.sim.backend import SimBackend  # the simulated world, a package of its own (dear/sim/)

    return SimBackend(**kwargs)
