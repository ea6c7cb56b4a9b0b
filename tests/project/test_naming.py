"""One name per quantity: old names still work with one deprecation message, and every CLI
answers a user error with one line and exit code 2 (dear/deprecation.py, dear/cli.py)."""

from __future__ import annotations

import ast
import json
import warnings

import pytest
import torch

from dear.cli import comma_list, command_line, exit_code
from dear.deprecation import rename_keys

from tests import ROOT


# ---------------------------------------------------------------- config keys
def test_rename_keys_moves_the_old_key_and_names_the_new_one():
    with pytest.warns(FutureWarning, match=r"a.yaml: key 'env.rounds' is deprecated; use 'env.n_rounds'"):
        out = rename_keys({"rounds": 2, "x": 1}, {"rounds": "n_rounds"}, "a.yaml: ", prefix="env.")
    assert out == {"n_rounds": 2, "x": 1}
    with pytest.raises(ValueError, match="'rounds' and 'n_rounds' are the same setting"):
        rename_keys({"rounds": 2, "n_rounds": 2}, {"rounds": "n_rounds"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the project's own files convert silently
        assert rename_keys({"rounds": 2}, {"rounds": "n_rounds"}, warn=False) == {"n_rounds": 2}


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
def test_old_flags_store_into_the_new_names_with_one_warning(module, capsys):
    parse, needed = _parsers()[module]
    new = parse([*needed, "--n-rounds", "1"])
    assert new.n_rounds == 1 and not hasattr(new, "rounds")
    capsys.readouterr()
    old = parse([*needed, "--rounds", "1"])
    assert old.n_rounds == 1
    assert capsys.readouterr().err.strip() == "warning: --rounds is deprecated; use --n-rounds"
    if hasattr(new, "n_agents"):
        assert parse([*needed, "--agents", "4"]).n_agents == 4
        assert "--agents is deprecated; use --n-agents" in capsys.readouterr().err


def test_old_flags_are_hidden_from_help(capsys):
    parse, needed = _parsers()["eval.run"]
    with pytest.raises(SystemExit):
        parse(["--help"])
    text = capsys.readouterr().out
    assert "--n-agents" in text and "--n-rounds" in text and "--temperature-range" in text
    assert "--agents" not in text and "--rounds " not in text and "--temp-range" not in text


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
def test_env_constructors_take_the_old_temperature_keyword_with_a_warning():
    from envs.debate_env import DebateEnv
    from envs.vector_env import DebateVectorEnv

    with pytest.warns(FutureWarning, match="DebateEnv: keyword 'temp_range' is deprecated; use 'temperature_range'"):
        env = DebateEnv(n_questions=4, temp_range=(0.2, 1.0))
    assert env.config.temperature_range == (0.2, 1.0)
    assert DebateEnv(n_questions=4).config.temperature_range == DebateEnv(
        n_questions=4, temperature_range=None).config.temperature_range
    with pytest.raises(ValueError, match="'temp_range' and 'temperature_range' are the same setting"):
        DebateEnv(n_questions=4, temp_range=(0.2, 1.0), temperature_range=(0.2, 1.0))
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['temprange'\]"):
        DebateEnv(n_questions=4, temprange=(0.2, 1.0))
    with pytest.warns(FutureWarning, match="DebateVectorEnv: keyword 'temp_range'"):
        venv = DebateVectorEnv(num_envs=2, n_questions=4, temp_range=(0.3, 1.1))
    assert venv.config.temperature_range == (0.3, 1.1)


def test_regulated_debater_takes_the_old_rounds_keyword(tmp_path):
    from dear.export import export_policy
    from dear.infer import RegulatedDebater
    from dear.policy import JointPolicy, PolicyConfig
    from dear.sim import SimBackend

    torch.manual_seed(0)
    exported = export_policy(JointPolicy(PolicyConfig(n_agents=3)), tmp_path / "policy", encoder="hashing",
                             training={"n_rounds": 2, "synthetic": True, "llm": "sim"})
    assert RegulatedDebater(exported, SimBackend(), n_rounds=1).config.n_rounds == 1
    with pytest.warns(FutureWarning, match="RegulatedDebater: keyword 'rounds' is deprecated; use 'n_rounds'"):
        assert RegulatedDebater(exported, SimBackend(), rounds=3).config.n_rounds == 3


def test_an_eval_results_directory_written_before_the_rename_still_resumes(tmp_path):
    from dataclasses import asdict

    from eval.run import EvalSettings, _check_settings

    s = EvalSettings(benchmarks=["gsm8k"], methods=["mad"], n=4, llm="sim", seed=0, n_agents=3, n_rounds=2,
                     max_tokens=64, temperature=0.7, top_p=0.9, sc_samples=9, checkpoint=None, encoder=None,
                     out=str(tmp_path))
    old = asdict(s)
    old["agents"], old["rounds"] = old.pop("n_agents"), old.pop("n_rounds")
    (tmp_path / "run.json").write_text(json.dumps({"settings": old}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _check_settings(tmp_path, s)["settings"]["agents"] == 3
    old["rounds"] = 1
    (tmp_path / "run.json").write_text(json.dumps({"settings": old}))
    with pytest.raises(ValueError, match="n_rounds: 1 there vs 2 now"):
        _check_settings(tmp_path, s)


def test_env_constructors_take_every_config_field_under_its_name():
    """Both env constructors build DebateEnvConfig from their own keywords: the names must be the config's."""
    import inspect
    from dataclasses import fields

    from envs.debate_env import DebateEnv, DebateEnvConfig
    from envs.vector_env import DebateVectorEnv

    names = {f.name for f in fields(DebateEnvConfig)}
    for env in (DebateEnv, DebateVectorEnv):
        assert names <= set(inspect.signature(env).parameters), env.__name__
    env = DebateEnv(n_questions=4, n_rounds=1, token_cost=0.5, seed=3)
    assert (env.config.n_rounds, env.config.token_cost, env.config.seed) == (1, 0.5, 3)


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
