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
    pytest.importorskip("dear.sim")
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


def test_each_kind_is_one_entry_of_the_table():
    """The spec forms, the presets of train/config.py and the kinds are all derived from KINDS."""
    from dear.llm import registry as R

    assert list(R.KINDS) == ["local", "smoke", "openai", "vllm", "sim", "bank"]
    assert all(R.kind_of(form.split("[")[0].replace("<hf model id or path>", "x")) == kind.name
               for kind in R.KINDS.values() for form in kind.forms)
    assert R.SPECS == {f: t for k in R.KINDS.values() for f, t in k.forms.items()} and all(R.SPECS.values())
    assert R.PRESETS == {n: s for k in R.KINDS.values() for n, s in k.presets.items()}
    assert all(R.kind_of(spec.format(url="http://h:1/v1")) == kind.name
               for kind in R.KINDS.values() for spec in kind.presets.values())
    assert [k for k, v in R.KINDS.items() if v.synthetic] == ["sim"]
    assert [k for k, v in R.KINDS.items() if v.llama_cpp] == ["local", "smoke"]
    assert [k for k, v in R.KINDS.items() if v.repeatable] == ["sim", "bank"]


def test_kind_of_and_its_errors():
    from dear.llm.registry import kind_of

    assert [kind_of(s) for s in ("local", " local:/m.gguf ", "smoke", "openai:http://h/v1#m", "vllm:Q/Q", "sim",
                                 "bank", "bank:/b")] == ["local", "local", "smoke", "openai", "vllm", "sim", "bank",
                                                          "bank"]
    with pytest.raises(ValueError, match=r"unknown LLM backend spec 'gpt' \(unrecognised kind 'gpt'\); valid: local"):
        kind_of("gpt")


def test_is_synthetic_reads_specs_and_model_ids():
    from dear.llm.registry import is_synthetic

    assert all(is_synthetic(x) for x in ("sim", " sim", "sim-v1"))
    assert not any(is_synthetic(x) for x in ("local", "smoke", "local:/sim.gguf", "openai:http://sim/v1", "bank",
                                             "smoke:smollm2", "llamacpp:sim.gguf", "simple", "", None))


def test_options_for_keeps_what_the_kind_takes():
    from dear.llm.registry import options_for

    shared = {"n_parallel": 4, "n_ctx": 1024, "speculative": "ngram-simple", "params_file": "p.json"}
    assert options_for("smoke", shared) == options_for("local:/m.gguf", shared) == {
        "n_parallel": 4, "n_ctx": 1024, "speculative": "ngram-simple"}
    assert options_for("sim", shared) == {"params_file": "p.json"}
    assert options_for("openai:http://h/v1", shared) == options_for("vllm:Q", shared) == options_for("bank", shared) == {}
    with pytest.raises(ValueError, match="'smok'"):
        options_for("smok", shared)


def test_the_factories_resolve_and_take_the_declared_options():
    """Each kind's declared options are keyword parameters of its backend class (the sim and bank classes are
    named, not imported, by the registry: the names must resolve)."""
    import inspect

    from dear.llm import registry as R
    from dear.llm.local import LocalLlamaBackend
    from dear.llm.openai_compat import OpenAICompatBackend
    from dear.llm.vllm_backend import VLLMBackend

    classes = {"local": LocalLlamaBackend, "smoke": LocalLlamaBackend, "openai": OpenAICompatBackend,
               "vllm": VLLMBackend, "sim": R._named(R.SIM_BACKEND), "bank": R._named(R.BANK_BACKEND)}
    assert set(classes) == set(R.KINDS) and isinstance(R._named(R.DEFAULT_BANK), str)
    for name, cls in classes.items():
        params = inspect.signature(cls).parameters
        open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
        assert open_ended or R.KINDS[name].options <= set(params), (name, R.KINDS[name].options - set(params))


def test_model_file_names_a_llama_cpp_models_file():
    from dear.llm import model_files
    from dear.llm.registry import model_file

    assert model_file("local") == (model_files.EMBEDDED_FILENAME, model_files.EMBEDDED_SHA256)
    assert model_file("sim") is None and model_file("openai:http://h/v1") is None and model_file("bank") is None
