"""One name per quantity (old names are gone, CHANGELOG.md lists them), and every CLI answers a user error with
one line and exit code 2 (dear/cli.py)."""

from __future__ import annotations

import ast

import pytest

from dear.cli import comma_list, command_line, exit_code

from tests import ROOT


# ---------------------------------------------------------------- CLI flags
def _parsers():
    from dear.debate.__main__ import parse_args as debate
    from dear.infer import parse_args as infer
    from dear.serve.__main__ import parse_args as serve
    from eval.layouts import parse_args as layouts
    from eval.run import parse_args as run
    from simworld.corpus import parse_args as corpus

    return {  # module -> (parse_args, arguments it needs besides the flags under test)
        "dear.debate": (debate, []), "dear.infer": (infer, ["--policy", "p", "--question", "q"]),
        "dear.serve": (serve, ["--policy", "p"]), "simworld.corpus": (corpus, ["--layout", "multiturn", "--out", "c"]),
        "eval.layouts": (layouts, ["--out", "l"]), "eval.run": (run, ["--benchmarks", "gsm8k"]),
    }


@pytest.mark.parametrize("module", sorted(_parsers()))
def test_old_flag_names_are_refused(module, capsys):
    parse, needed = _parsers()[module]
    new = parse([*needed, "--n-rounds", "1"])
    assert new.n_rounds == 1 and not hasattr(new, "rounds")
    for old in ("--rounds", "--agents", "--temp-range"):
        with pytest.raises(SystemExit):
            parse([*needed, old, "1"])
        assert f"unrecognized arguments: {old}" in capsys.readouterr().err


# ---------------------------------------------------------------- the one CLI error rule
def _fails(exc):
    def main():
        raise exc
    return main


def test_a_user_error_is_one_line_and_exit_2(capsys):
    assert exit_code(_fails(ValueError("--n must be >= 1")), "python -m x", argv=[]) == 2
    err = capsys.readouterr().err
    assert err == "python -m x: error: --n must be >= 1\n"
    assert exit_code(_fails(FileNotFoundError("no such file: a.yaml")), "python -m x", argv=[]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_comma_lists_name_the_bad_text():
    import argparse

    assert comma_list(float)("0, 0.5,1") == (0.0, 0.5, 1.0) and comma_list(int)("3") == (3,)
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated int values, got '1,x'"):
        comma_list(int)("1,x")
    with pytest.raises(argparse.ArgumentTypeError, match="at least one"):
        comma_list(float)(" , ")


def test_a_recorded_command_line_can_be_pasted_into_a_shell():
    import shlex

    argv = ["--out", "results/my run", "--methods", "mad,dear", "--note", "it's"]
    line = command_line("python -m eval.run", argv)
    assert line.startswith("python -m eval.run --out 'results/my run'")
    assert shlex.split(line)[3:] == argv  # the shell gives back exactly the arguments


def test_the_traceback_only_with_verbose_and_other_codes_on_request(capsys):
    assert exit_code(_fails(ValueError("bad")), "python -m x", argv=["-v"]) == 2
    assert "Traceback" in capsys.readouterr().err
    assert exit_code(_fails(RuntimeError("changed")), "p", codes={RuntimeError: 1}, argv=[]) == 1
    with pytest.raises(KeyError):  # a bug is not a user error: it keeps its traceback
        exit_code(_fails(KeyError("x")), "p", argv=[])
    assert exit_code(lambda: 3, "p", argv=[]) == 3
    assert exit_code(lambda: None, "p", argv=[]) == 0
    assert exit_code(lambda: ["results"], "p", argv=[]) == 0


def test_every_cli_module_ends_in_the_one_error_rule():
    """Each `python -m` entry point's __main__ block calls dear.cli.run (imported as run_cli)."""
    offenders = []
    for top in ("dear", "eval", "train"):
        for path in (ROOT / top).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:
                if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                    calls = {ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
                    if "run_cli" not in calls:
                        offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"__main__ blocks that do not use dear.cli.run: {offenders}"


# ---------------------------------------------------------------- keyword arguments
def test_env_constructors_take_every_config_field_under_its_name():
    """The env's settings are declared once (DebateEnvConfig): both constructors take its fields as keywords and
    refuse any other name, and a training config's env section passes through under the same names
    (train.build.env_knobs)."""
    from dataclasses import fields

    from envs.debate_env import DebateEnv, DebateEnvConfig
    from envs.vector_env import DebateVectorEnv
    from train.build import env_knobs
    from train.config import load_config

    env = DebateEnv(n_questions=4, n_rounds=1, token_cost=0.5, seed=3, temperature_range=(0.2, 1.0))
    assert (env.config.n_rounds, env.config.token_cost, env.config.seed) == (1, 0.5, 3)
    with pytest.raises(TypeError, match=r"DebateEnv\(\) got unexpected keyword arguments \['temp_range'\]"):
        DebateEnv(n_questions=4, temp_range=(0.2, 1.0))
    with pytest.raises(TypeError, match=r"DebateVectorEnv\(\) got unexpected keyword arguments \['temprange'\]"):
        DebateVectorEnv(num_envs=2, n_questions=4, temprange=(0.3, 1.1))
    names = {f.name for f in fields(DebateEnvConfig)}
    for config in ("gsm8k", "gsm8k-live", "sim", "sim-mixed"):
        knobs = env_knobs(load_config(config))
        assert set(knobs) <= names
        DebateEnvConfig(**knobs)  # every shipped config's env section is a valid env
    bank = env_knobs(load_config("gsm8k"))
    assert (bank["start_width"], tuple(bank["turn_kinds"]), bank["confidence_feature"]) == (1, ("keep", "fresh"), True)


def test_no_two_classes_share_a_name():
    names: dict[str, list[str]] = {}
    for top in ("dear", "envs", "train", "eval"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    names.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert not {k: v for k, v in names.items() if len(v) > 1}


def test_the_training_env_takes_the_exchange_layout_from_the_config():
    from dear.debate.engine import DebateConfig
    from train.build import make_vector_env
    from train.config import ConfigError, load_config
    from dear.sim import SimBackend

    assert load_config("sim-stylised").env.layout == DebateConfig.layout  # one default, the engine's
    cfg = load_config("sim-stylised", ["env.layout=multiturn", "rollout.envs_per_worker=2", "rollout.group_size=1", "rollout.episodes_per_iter=2"])
    venv = make_vector_env(cfg, SimBackend())
    assert venv.core.engine.config.layout == "multiturn"
    venv.close()
    with pytest.raises(ConfigError, match="env.layout: must be one of"):
        load_config("sim-stylised", ["env.layout=chat"])
