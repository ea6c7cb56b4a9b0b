"""The backend kinds in one table (`KINDS`) and the one parser of backend specs.

A spec is `kind` or `kind:argument` (`local:/path/model.gguf`, `openai:http://host:port/v1#model`). Each `Kind` says
how its specs are written (with their help), what builds its backend, which keyword options that backend takes,
whether it is synthetic, whether it decodes with llama.cpp threads on this machine, and which training presets
(`train/config.py`'s `llm.preset`) stand for it. `make_backend(spec)` builds a backend; `check_spec`, `kind_of`,
`options_for`, `is_synthetic`, `uses_llama_cpp`, `check_repeatable` and `model_file` answer questions about a spec without building
anything. No other module parses a spec.

Adding a backend: a module with the backend class (on the `dear.llm.base.Backend` contract) and one entry in `KINDS`.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dear.llm.base import Backend


@dataclass(frozen=True)
class Kind:
    """One backend kind: the forms of its specs, its factory and what it takes."""

    name: str
    forms: Mapping[str, str]  # spec form -> help (--help and the error of a bad spec list them)
    build: Callable[..., Backend]  # build(argument, **options): the backend of a spec of this kind
    options: frozenset[str]  # keyword options its backend takes (what `options_for` keeps of shared flags)
    argument: Literal["none", "optional", "required"] = "none"  # the text after `kind:`
    missing: str = ""  # why a spec without its required argument is refused
    synthetic: bool = False  # no language model: its outputs are labelled synthetic everywhere
    llama_cpp: bool = False  # decodes with llama.cpp threads on this machine (n_threads, DEAR_LLAMA_THREADS)
    repeatable: bool = False  # a seed gives the same texts without the llama.cpp `repeatable` option (no batching)
    presets: Mapping[str, str] = field(default_factory=dict)  # train/config.py llm.preset name -> its spec


def _named(path: str) -> Any:
    """The attribute `module:name`, imported now. Kinds living above `dear/llm/` (the simulated world `dear/sim/`,
    the sample bank `dear/bank/`) are named here, not imported, so that `dear/llm/` imports nothing beside or above
    it (tests/project/test_layers.py); tests/dear/llm/test_llm_registry.py checks that every name resolves."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _local(path: str, **options: Any) -> Backend:
    from dear.llm.local import LocalLlamaBackend
    from dear.llm.model_files import embedded_model_path

    if path:
        return LocalLlamaBackend(path, **options)
    return LocalLlamaBackend(embedded_model_path(), model_id="local:qwen2.5-coder-1.5b-instruct-q4_k_m", **options)


def _smoke(_: str, **options: Any) -> Backend:
    from dear.llm.local import LocalLlamaBackend
    from dear.llm.model_files import smoke_model_path

    options.setdefault("n_ctx", 2048)
    return LocalLlamaBackend(smoke_model_path(), model_id="smoke:smollm2-135m-instruct-q4_1", **options)


def _openai(target: str, **options: Any) -> Backend:
    from dear.llm.openai_compat import OpenAICompatBackend

    url, _, model = target.partition("#")
    return OpenAICompatBackend(url, model=model or options.pop("model", None), **options)


def _vllm(model: str, **options: Any) -> Backend:
    from dear.llm.vllm_backend import VLLMBackend

    return VLLMBackend(model, **options)


def _sim(_: str, **options: Any) -> Backend:
    return _named(SIM_BACKEND)(**options)


def _bank(directory: str, **options: Any) -> Backend:
    return _named(BANK_BACKEND)(directory or _named(DEFAULT_BANK), **options)


SIM_BACKEND = "dear.sim.backend:SimBackend"  # the simulated world (dear/sim/)
BANK_BACKEND = "dear.bank.backend:BankBackend"  # a sample bank's replayed samples (dear/bank/)
DEFAULT_BANK = "dear.bank.backend:DEFAULT_BANK"  # the embedded model's committed bank

LLAMA_OPTIONS = frozenset({"n_parallel", "n_ctx", "n_threads", "n_batch", "cache_prompt", "extra_sampling", "verbosity",
                           "poll", "speculative", "draft_max", "ngram_size", "progress_chunks",
                           "repeatable"})
OPENAI_OPTIONS = frozenset({"model", "api_key", "max_concurrency", "connect_timeout_s", "read_timeout_base_s",
                            "read_timeout_per_token_s", "timeout_s", "total_timeout_s", "list_timeout_s", "max_retries",
                            "backoff_base_s", "backoff_max_s", "retry_after_max_s", "context_length", "extra_body"})
# vLLM takes any engine argument through make_backend; these are the ones configs set (llm.options.vllm)
VLLM_OPTIONS = frozenset({"enable_prefix_caching", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len"})
SIM_OPTIONS = frozenset({"params", "seed", "fail_rate", "params_file", "text_bank"})
BANK_OPTIONS = frozenset({"benchmark", "split", "profile", "max_tokens", "live", "grow", "seed", "temperature"})

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("local", {"local": "the embedded Qwen2.5-Coder-1.5B-Instruct Q4_K_M through llama.cpp (CPU)",
                   "local:/path/model.gguf": "any GGUF file through llama.cpp"},
         _local, LLAMA_OPTIONS, argument="optional", llama_cpp=True, presets={"local": "local"}),
    Kind("smoke", {"smoke": "SmolLM2-135M-Instruct through llama.cpp (fast, for tests)"},
         _smoke, LLAMA_OPTIONS, llama_cpp=True, presets={"smoke": "smoke"}),
    Kind("openai", {"openai:http://host:port/v1[#model]": "any OpenAI-compatible chat-completions server"},
         _openai, OPENAI_OPTIONS, argument="required", missing="openai needs a base URL",
         presets={"openai": "openai:{url}"}),  # the URL is llm.url
    Kind("vllm", {"vllm:<hf model id or path>": "vLLM in-process on a CUDA GPU"},
         _vllm, VLLM_OPTIONS, argument="required", missing="vllm needs a model id or path",
         presets={"qwen3-8b-vllm": "vllm:Qwen/Qwen3-8B"}),  # the paper's setting, one vLLM engine per GPU
    Kind("sim", {"sim": "synthetic debaters (no LLM)"},
         _sim, SIM_OPTIONS, synthetic=True, repeatable=True, presets={"sim": "sim"}),
    Kind("bank", {"bank[:DIR]": "a sample bank's real samples replayed (dear/bank; default: the embedded model's "
                                "committed bank)"},
         _bank, BANK_OPTIONS, argument="optional", repeatable=True, presets={"bank": "bank"}),  # the main job's world
)}

SPECS = {form: text for kind in KINDS.values() for form, text in kind.forms.items()}  # every spec form, with its help
PRESETS = {name: spec for kind in KINDS.values() for name, spec in kind.presets.items()}  # llm.preset -> spec


def _unknown(spec: str, why: str) -> ValueError:
    return ValueError(f"unknown LLM backend spec {spec!r} ({why}); valid: {' | '.join(SPECS)}")


def _parse(spec: str) -> tuple[Kind, str]:
    """The kind and the argument of a spec; ValueError naming the spec and the valid forms if it has none."""
    name, sep, argument = spec.strip().partition(":")
    kind = KINDS.get(name)
    if kind is None:
        raise _unknown(spec, f"unrecognised kind {name!r}")
    if kind.argument == "none" and sep:
        raise _unknown(spec, f"{name} takes no argument")
    if kind.argument == "required" and not argument.partition("#")[0]:
        raise _unknown(spec, kind.missing)
    return kind, argument


def check_spec(spec: str) -> str:
    """The spec, stripped, if its form is one `make_backend` accepts (nothing is imported or loaded: CLIs call
    it while parsing flags); ValueError naming the spec and the valid forms otherwise."""
    _parse(spec)
    return spec.strip()


def kind_of(spec: str) -> str:
    """The kind of a spec (`local`, `smoke`, `vllm`, `openai`, `sim`, `bank`); ValueError for a bad spec."""
    return _parse(spec)[0].name


def options_for(spec: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `options` (shared flags or settings such as n_parallel, n_ctx, params_file) that the spec's
    backend takes; the others are left out. ValueError for a bad spec."""
    takes = _parse(spec)[0].options
    return {k: v for k, v in options.items() if k in takes}


def uses_llama_cpp(spec: str) -> bool:
    """Whether the spec's backend decodes with llama.cpp threads on this machine; ValueError for a bad spec."""
    return _parse(spec)[0].llama_cpp


def check_repeatable(specs: Sequence[str], what: str = "--repeatable") -> None:
    """ValueError naming the first backend spec that cannot decode repeatably: `repeatable` is a setting of the
    llama.cpp backends (local, smoke) and a no-op for the kinds that repeat anyway (sim, bank); an OpenAI-compatible
    server or vLLM batches requests as it sees fit."""
    llama = ", ".join(k for k, v in KINDS.items() if v.llama_cpp)
    anyway = " and ".join(k for k, v in KINDS.items() if v.repeatable)
    for spec in specs:
        kind = _parse(spec)[0]
        if not (kind.llama_cpp or kind.repeatable):
            raise ValueError(f"{what}: the {kind.name} backend ({spec.strip()}) batches requests as it sees fit, "
                             f"so its texts cannot be made repeatable; repeatable applies to the llama.cpp backends "
                             f"({llama}) and is a no-op for {anyway}")


def is_synthetic(name: str) -> bool:
    """Whether `name`, a backend spec or a model id a backend recorded (`sim`, `sim-v1`), is of a synthetic kind: its
    kind is the text before the first ':' or '-'. Anything else (a real kind, an unknown name, '') is not."""
    kind = KINDS.get(re.split(r"[:-]", str(name).strip(), maxsplit=1)[0])
    return bool(kind and kind.synthetic)


def model_file(spec: str) -> tuple[str, str] | None:
    """(file name, sha256) of the GGUF file a llama.cpp spec loads (the embedded model's from its manifest, without
    assembling it; another file is hashed now); None for a backend with no model file here. ValueError for a bad
    spec."""
    from dear.llm import model_files

    kind, path = _parse(spec)
    if not kind.llama_cpp:
        return None
    if kind.name == "local" and not path:
        return model_files.EMBEDDED_FILENAME, model_files.EMBEDDED_SHA256
    file = Path(path) if path else model_files.smoke_model_path()
    return file.name, hashlib.sha256(file.read_bytes()).hexdigest()


def make_backend(spec: str, **kwargs: Any) -> Backend:
    """Build a backend from a spec string; kwargs go to the backend's constructor."""
    kind, argument = _parse(spec)
    return kind.build(argument, **kwargs)
