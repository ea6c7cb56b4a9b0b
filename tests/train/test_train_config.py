"""Config loading: presets, extends, dotted overrides, and errors that name the bad key and file."""

import warnings

import pytest

from train.config import CONFIG_DIR, ConfigError, config_from_dict, config_names, load_config


def test_shipped_configs_load():
    for name in ("gsm8k", "gsm8k-live", "smoke", "sim"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # shipped configs use the current key names
            cfg = load_config(name)
        assert cfg.env.n_agents >= 2
    assert load_config("gsm8k-live").llm.backend_spec() == "local"
    assert load_config("smoke").llm.backend_spec() == "smoke"
    assert load_config("sim-stylised").llm.synthetic


def test_presets():
    assert load_config("gsm8k-live", ["llm.preset=qwen3-8b-vllm"]).llm.backend_spec() == "vllm:Qwen/Qwen3-8B"
    cfg = load_config("gsm8k-live", ["llm.preset=openai", "llm.url=http://h:8000/v1#m"])
    assert cfg.llm.backend_spec() == "openai:http://h:8000/v1#m"
    with pytest.raises(ConfigError, match="llm.url"):
        load_config("gsm8k-live", ["llm.preset=openai"])


def test_dotted_overrides_and_types():
    cfg = load_config("sim-stylised", ["happo.clip_coef=0.3", "rollout.num_workers=2", "env.temperature_range=[0.2, 1.0]",
                              "happo.target_kl=0.02", "happo.target_kl=null"])
    assert cfg.happo.clip_coef == 0.3 and cfg.rollout.num_workers == 2
    assert cfg.env.temperature_range == (0.2, 1.0)
    assert cfg.happo.target_kl is None
    assert isinstance(load_config("sim-stylised", ["happo.clip_coef=1"]).happo.clip_coef, float)  # int -> float ok


def test_unknown_key_in_file_names_key_and_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("extends: %s\nhappo:\n  clip_coeff: 0.1\n" % (CONFIG_DIR / "sim.yaml"))
    with pytest.raises(ConfigError) as e:
        load_config(str(p))
    assert "happo.clip_coeff" in str(e.value) and "bad.yaml" in str(e.value)


def test_mistyped_value_names_key(tmp_path):
    p = tmp_path / "typo.yaml"
    p.write_text("rollout:\n  num_workers: two\n")
    with pytest.raises(ConfigError, match=r"typo.yaml.*rollout.num_workers.*int"):
        load_config(str(p))
    with pytest.raises(ConfigError, match=r"happo.norm_adv.*bool"):
        load_config("sim-stylised", ["happo.norm_adv=3"])
    with pytest.raises(ConfigError, match=r"happo.agent_order.*fixed"):
        load_config("sim-stylised", ["happo.agent_order=backwards"])


def test_unknown_override_and_section():
    with pytest.raises(ConfigError, match="command line.*unknown key 'happo.lr'"):
        load_config("sim-stylised", ["happo.lr=0.1"])
    with pytest.raises(ConfigError, match="unknown key 'optimizer'"):
        load_config("sim-stylised", ["optimizer.lr=0.1"])
    with pytest.raises(ConfigError, match="must look like"):
        load_config("sim-stylised", ["happo.clip_coef"])


def test_bad_values_and_unknown_config():
    with pytest.raises(ConfigError, match="env.n_agents"):
        load_config("sim-stylised", ["env.n_agents=1"])
    with pytest.raises(ConfigError, match="env.top_p_range"):
        load_config("sim-stylised", ["env.top_p_range=[0.9, 0.5]"])
    with pytest.raises(ConfigError, match="unknown config 'nope'.*gsm8k"):
        load_config("nope")


def test_a_config_saved_as_a_run_saves_it_loads_back_equal():
    import yaml

    cfg = load_config("gsm8k-live", ["run.seed=7"])
    saved = yaml.safe_dump(cfg.to_dict(), sort_keys=False)  # a run's config.yaml (train.runner)
    assert config_from_dict(yaml.safe_load(saved)) == cfg


def test_config_names_are_the_files_of_configs_and_the_help_lists_them(capsys):
    from train.happo import parse_args

    assert config_names() == sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")) and "sim" in config_names()
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in config_names())


def test_help_lists_every_config_key_with_default_and_help(capsys):
    import dataclasses

    import pytest

    from train.config import TrainConfig, field_help
    from train.happo import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    keys = [key for key, _, _ in field_help()]
    n_fields = sum(len(dataclasses.fields(f.type if not isinstance(f.type, str) else getattr(TrainConfig(), f.name)))
                   for f in dataclasses.fields(TrainConfig))
    assert len(keys) == n_fields
    for key, default, text in field_help():
        assert f"{key} = {default}" in out
        assert text, f"{key} has no help comment in train/config.py"
    assert "happo.ent_coef_behavior = 0.01  -- entropy bonus" in out


def test_sampling_ranges_use_the_engines_bounds():
    import pytest

    from train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="env.temperature_range"):
        load_config("sim-stylised", ["env.temperature_range=[0.1,2.5]"])
    with pytest.raises(ConfigError, match="env.top_p_range"):
        load_config("sim-stylised", ["env.top_p_range=[0.0,1.0]"])
    load_config("sim-stylised", ["env.temperature_range=[0.0,2.0]", "env.top_p_range=[0.05,1.0]"])


# ---------------------------------------------------------------- old key names (gone: CHANGELOG.md)
OLD_KEYS = ["env.num_agents", "env.rounds", "policy.init_log_std"]


@pytest.mark.parametrize("old", OLD_KEYS)
def test_an_old_key_name_is_an_unknown_key(tmp_path, old):
    section, name = old.split(".")
    path = tmp_path / "old.yaml"
    path.write_text(f"extends: {CONFIG_DIR / 'sim.yaml'}\n{section}:\n  {name}: 3\n")
    with pytest.raises(ConfigError, match=f"{path}: unknown key '{old}'"):
        load_config(str(path))
    with pytest.raises(ConfigError, match=f"unknown key '{old}'"):
        load_config("sim-stylised", [f"{old}=3"])
    data = load_config("sim-stylised").to_dict()
    data[section][name] = 3
    with pytest.raises(ConfigError, match=f"saved: unknown key '{old}'"):
        config_from_dict(data, "saved: ")


BAD_RANGES = [  # (key, value): every documented bound of the behavior policy's sampling ranges, just outside
    ("temperature_range", "[-0.1,1.0]"),  # low >= 0
    ("temperature_range", "[0.1,2.01]"),  # high <= T_MAX = 2
    ("temperature_range", "[1.0,1.0]"),  # low < high
    ("top_p_range", "[0.0,1.0]"),  # low > 0
    ("top_p_range", "[0.5,1.01]"),  # high <= 1
    ("top_p_range", "[0.9,0.5]"),  # low < high
]


def test_every_sampling_bound_is_checked_once_for_config_and_env():
    """The config and the env answer from the same rule (dear.debate.engine.sampling_range_errors): the config
    names its dotted key before anything starts, the env its field; the bounds themselves are accepted."""
    import pytest
    import yaml

    from envs.debate_env import DebateEnvConfig
    from train.config import ConfigError, load_config

    for key, value in BAD_RANGES:
        with pytest.raises(ConfigError, match=f"env.{key}"):
            load_config("sim-stylised", [f"env.{key}={value}"])
        with pytest.raises(ValueError, match=key):
            DebateEnvConfig(**{key: tuple(yaml.safe_load(value))})
    ok = ["env.temperature_range=[0.0,2.0]", "env.top_p_range=[0.01,1.0]"]
    cfg = load_config("sim-stylised", ok)
    DebateEnvConfig(temperature_range=cfg.env.temperature_range, top_p_range=cfg.env.top_p_range)


def test_backend_options_by_kind_follow_the_chosen_backend():
    """gsm8k-live.yaml's llama.cpp options sit under llm.options.local: another preset does not receive them."""
    from train.build import backend_kwargs

    local = load_config("gsm8k-live")
    assert backend_kwargs(local) == {"n_parallel": 6, "n_ctx": 3072}
    assert backend_kwargs(load_config("gsm8k-live", ["llm.preset=qwen3-8b-vllm"])) == {}
    vllm = load_config("gsm8k-live", ["llm.preset=qwen3-8b-vllm", "llm.options.vllm.tensor_parallel_size=2"])
    assert backend_kwargs(vllm) == {"tensor_parallel_size": 2}
    openai = load_config("gsm8k-live", ["llm.preset=openai", "llm.url=http://127.0.0.1:9/v1",
                                   "llm.options.openai.max_concurrency=8"])
    assert backend_kwargs(openai) == {"max_concurrency": 8}
    flat = load_config("sim-stylised", ["llm.options={fail_rate: 0.1}"])  # plain options go to whichever backend
    assert backend_kwargs(flat) == {"fail_rate": 0.1}
    with pytest.raises(ConfigError, match=r"llm.options mixes backend kinds \['local'\] with plain options "
                                          r"\['n_ctx'\]"):
        load_config("gsm8k-live", ["llm.options.n_ctx=2048"])


def test_agent_profiles_take_compact_forms_and_a_bad_one_is_named_by_its_index(tmp_path):
    cfg = load_config("gsm8k-modes")
    assert [p.style for p in cfg.env.profiles(cfg.llm.backend_spec())] == ["cot", "pot", "cot"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {CONFIG_DIR / 'gsm8k-modes.yaml'}\nenv:\n  agent_profiles: [cot, 5, cot]\n")
    with pytest.raises(ConfigError, match=r"key 'env.agent_profiles\[1\]': expected dict or str, got int 5"):
        load_config(str(bad))
