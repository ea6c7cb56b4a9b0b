"""LLM backends: one batched chat interface over llama.cpp (CPU), OpenAI-compatible servers and vLLM (GPU)."""

from dear.llm.base import Backend, BackendError, ChatMessage, ChatRequest, Completion
from dear.llm.cache import CachedBackend
from dear.llm.registry import SPECS, make_backend

__all__ = [
    "SPECS",
    "Backend",
    "BackendError",
    "CachedBackend",
    "ChatMessage",
    "ChatRequest",
    "Completion",
    "make_backend",
]
