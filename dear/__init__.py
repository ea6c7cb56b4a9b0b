"""DEAR: regulating debate relationships in multi-LLM debate with RL (see docs/ARCHITECTURE.md)."""

__version__ = "0.1.0"
