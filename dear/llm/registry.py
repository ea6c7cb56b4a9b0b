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
}


def _unknown(spec: str, why: str) -> ValueError:
    listing = "\n".join(f"  {k:38s} {v}" for k, v in SPECS.items())
    return ValueError(f"unknown LLM backend spec {spec!r} ({why}); valid specs:\n{listing}")


def make_backend(spec: str, **kwargs) -> Backend:
    """Build a backend from a spec string; kwargs go to the backend's constructor."""
    kind, _, rest = spec.strip().partition(":")
    if kind == "local":
        from dear.llm.local import LocalLlamaBackend
        from dear.llm.model_files import embedded_model_path

        if rest:
            return LocalLlamaBackend(rest, **kwargs)
        return LocalLlamaBackend(
            embedded_model_path(), model_id="local:qwen2.5-coder-1.5b-instruct-q4_k_m", **kwargs
        )
    if kind == "smoke" and not rest:
        from dear.llm.local import LocalLlamaBackend
        from dear.llm.model_files import smoke_model_path

        kwargs.setdefault("n_ctx", 2048)
        return LocalLlamaBackend(smoke_model_path(), model_id="smoke:smollm2-135m-instruct-q4_1", **kwargs)
    if kind == "openai":
        from dear.llm.openai_compat import OpenAICompatBackend

        url, _, model = rest.partition("#")
        if not url:
            raise _unknown(spec, "openai needs a base URL")
        return OpenAICompatBackend(url, model=model or kwargs.pop("model", None), **kwargs)
    if kind == "vllm":
        from dear.llm.vllm_backend import VLLMBackend

        if not rest:
            raise _unknown(spec, "vllm needs a model id or path")
        return VLLMBackend(rest, **kwargs)
    if kind == "sim" and not rest:
        from dear.sim.backend import SimBackend  # the simulated world, a package of its own (dear/sim/)

        return SimBackend(**kwargs)
    raise _unknown(
        spec, f"unrecognised kind {kind!r}" if kind not in ("smoke", "sim") else f"{kind} takes no argument"
    )
