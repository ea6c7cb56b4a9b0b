"""make_backend: spec parsing and errors."""

from __future__ import annotations

import pytest

from dear.llm import BackendError, make_backend
from dear.llm.local import LocalLlamaBackend


@pytest.mark.parametrize("spec", ["gpt", "llama:/x.gguf", "smoke:big", "sim:3", ""])
def test_unknown_spec_lists_the_valid_ones(spec):
    with pytest.raises(ValueError) as err:
        make_backend(spec)
    message = str(err.value)
    assert repr(spec) in message
    for valid in (
        "local",
        "local:/path/model.gguf",
        "smoke",
        "openai:http://host:port/v1[#model]",
        "vllm:",
        "sim",
    ):
        assert valid in message


@pytest.mark.parametrize("spec", ["openai:", "vllm:"])
def test_spec_without_its_argument(spec):
    with pytest.raises(ValueError, match="needs"):
        make_backend(spec)


def test_openai_url_and_model_split():
    backend = make_backend("openai:http://127.0.0.1:9/v1#my-model", api_key="k")
    assert backend.base_url == "http://127.0.0.1:9/v1" and backend.model == "my-model"
    assert backend.model_id == "openai:my-model"


def test_local_path_must_exist(tmp_path):
    with pytest.raises(BackendError, match="not found"):
        make_backend(f"local:{tmp_path}/missing.gguf")


def test_vllm_without_vllm_names_the_extra():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(BackendError, match=r"\.\[gpu\]"):
            make_backend("vllm:Qwen/Qwen2.5-1.5B-Instruct")
    else:
        pytest.skip("vllm is installed here")


def test_smoke_and_local_path_build_real_backends():
    pytest.importorskip("xllamacpp")
    from dear.llm.model_files import smoke_model_path

    with make_backend("smoke", n_parallel=1, n_ctx=256, n_threads=1) as smoke:
        assert isinstance(smoke, LocalLlamaBackend) and smoke.context_length == 256
        assert smoke.model_id.startswith("smoke:")
    with make_backend(f"local:{smoke_model_path()}", n_parallel=2, n_ctx=128, n_threads=1) as local:
        assert local.model_id == f"llamacpp:{smoke_model_path().name}" and local.n_parallel == 2


def test_sim_is_built_lazily():
    pytest.importorskip("dear.llm.sim")
    backend = make_backend("sim")
    assert backend.synthetic


@pytest.mark.parametrize("prog", ["dear.infer", "eval.run", "simworld.fresh_samples", "dear.serve"])
def test_a_bad_spec_is_refused_while_the_flags_are_parsed(prog, monkeypatch, capsys):
    """Every CLI checks --llm before anything loads: an argparse error (exit 2) naming the spec, one line."""
    import importlib

    import dear.llm.registry as registry

    monkeypatch.setattr(registry, "make_backend", lambda *a, **k: pytest.fail("a backend was built"))
    mod = importlib.import_module(prog if prog != "dear.serve" else "dear.serve.__main__")
    extra = ["--benchmarks", "gsm8k"] if prog == "eval.run" else []
    with pytest.raises(SystemExit) as stop:
        mod.main(["--llm", "locl", *extra])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --llm: unknown LLM backend spec 'locl'" in err and "valid: local |" in err


def test_check_spec_accepts_every_form_make_backend_builds():
    from dear.llm.registry import check_spec

    for spec in ("local", "local:/x.gguf", "smoke", "sim", " sim ", "openai:http://h:1/v1#m", "vllm:Qwen/Q",
                 "bank", "bank:/some/bank"):
        assert check_spec(spec) == spec.strip()


def test_bank_names_its_directory_and_shelves(tmp_path):
    from dear.bank.store import Bank
    from dear.llm import BackendError, make_backend

    Bank.open(tmp_path, "m.gguf", "0" * 64)
    with pytest.raises(BackendError, match="has no shelf of gsm8k/train/cot; shelves: none"):
        make_backend(f"bank:{tmp_path}")
