"""The shared command-line flags (dear/debate/cli_args.py) and the one error path every CLI ends in (dear/cli.py):
one name, default and help per flag, the accepted values in --help, and `prog: error: ...` with exit code 2."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from dear.cli import exit_code, require_at_least
from dear.debate.cli_args import (
    OMIT,
    REQUIRED,
    add_backend_args,
    add_debate_args,
    add_output_args,
    add_question_args,
)
from dear.debate.prompts import LAYOUTS
from dear.llm.local import SPECULATIVE_TYPES
from dear.llm.registry import SPECS
from dear.tasks import task_names

from tests import ROOT


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def _help(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_help().split())  # one line: a listed value may wrap anywhere


# ---------------------------------------------------------------- the groups
def test_groups_give_the_shared_defaults_and_a_cli_keeps_its_own():
    p = argparse.ArgumentParser()
    add_backend_args(p)
    add_debate_args(p)
    a = p.parse_args([])
    assert (a.llm, a.max_tokens, a.parallel, a.n_ctx, a.n_agents, a.n_rounds, a.seed) == ("local", 512, None, None,
                                                                                          3, 2, 0)
    q = argparse.ArgumentParser()
    add_backend_args(q, llm="smoke", max_tokens=384, parallel=6, n_ctx=3072)
    add_debate_args(q, n_rounds=1, sampling=True)
    b = q.parse_args(["--n-rounds", "3"])
    assert (b.llm, b.max_tokens, b.parallel, b.n_ctx, b.n_rounds, b.temperature, b.top_p) == ("smoke", 384, 6, 3072,
                                                                                              3, 0.7, 0.9)


def test_omit_leaves_a_flag_out_and_required_makes_it_mandatory(capsys):
    p = argparse.ArgumentParser(prog="python -m x")
    add_backend_args(p, max_tokens=OMIT, parallel=OMIT, n_ctx=OMIT)
    add_debate_args(p, n_agents=OMIT, layout=REQUIRED)
    add_question_args(p, task=OMIT, split=OMIT)
    add_output_args(p, out_help="results", out=REQUIRED, path=True)
    flags = _flags(p)
    assert {"--llm", "--n-rounds", "--layout", "--out"} <= set(flags)
    assert not {"--max-tokens", "--parallel", "--n-ctx", "--n-agents", "--task", "--split",
                "--speculative", "--temperature", "--report-only", "-v"} & set(flags)
    with pytest.raises(SystemExit):
        p.parse_args(["--out", "o"])
    assert "python -m x: error: the following arguments are required: --layout" in capsys.readouterr().err
    a = p.parse_args(["--out", "o", "--layout", LAYOUTS[-1]])
    assert isinstance(a.out, Path) and a.layout == LAYOUTS[-1]


def test_help_lists_the_backends_tasks_layouts_and_speculative_types():
    p = argparse.ArgumentParser()
    add_backend_args(p, speculative=True)
    add_debate_args(p, layout="multiturn")
    add_question_args(p)
    text = _help(p)
    for value in (*SPECS, *task_names(), *LAYOUTS, *SPECULATIVE_TYPES):
        assert value in text, value
    assert "(default 512)" in text and "(default local)" in text  # defaults shown where there is one


def test_require_at_least_names_the_flag_and_the_value():
    a = argparse.Namespace(n=3, n_ctx=0)
    require_at_least(a, 1, "n")
    with pytest.raises(ValueError, match=r"^--n-ctx must be >= 1, got 0$"):
        require_at_least(a, 1, "n", "n_ctx")


# ---------------------------------------------------------------- every CLI
def _llm_parsers():
    from dear.debate.__main__ import parse_args as debate
    from dear.infer import parse_args as infer
    from eval.judge_offline import parse_args as judge
    from eval.layouts import parse_args as layouts
    from eval.run import parse_args as run
    from simworld.corpus import parse_args as corpus

    return {"dear.debate": debate, "dear.infer": infer, "eval.judge_offline": judge, "eval.layouts": layouts,
            "eval.run": run, "simworld.corpus": corpus}


@pytest.mark.parametrize("module", sorted(_llm_parsers()))
def test_every_cli_help_lists_the_backend_specs(module, capsys):
    with pytest.raises(SystemExit):
        _llm_parsers()[module](["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(spec in text for spec in SPECS), module


def test_eval_run_help_lists_every_method_and_intervention(capsys):
    from eval import methods as M
    from eval.run import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse may break a name at its hyphen
    for name in (*M.METHODS, *M.INTERVENTIONS, *task_names()):
        assert name in text, name


def _user_errors(tmp_path: Path):
    """(prog, main, argv, the error line's start) of a user error in each CLI that used to write its own."""
    import dear.export
    import dear.serve.__main__
    import eval.layouts
    import simworld.corpus
    import simworld.fit

    (tmp_path / "file").write_text("")
    return [
        ("python -m simworld.fit", simworld.fit.main, ["--corpus", str(tmp_path), "--out", str(tmp_path / "o")],
         "corpus file not found"),
        ("python -m simworld.corpus", simworld.corpus.main,
         ["--llm", "sim", "--layout", "single", "--out", str(tmp_path / "c"), "--repeats", "0"],
         "--repeats must be >= 1, got 0"),
        ("python -m eval.layouts", eval.layouts.main, ["--llm", "sim", "--out", str(tmp_path / "file")],
         f"--out {tmp_path / 'file'} exists and is not a directory"),
        ("python -m dear.export", dear.export.main, [str(tmp_path / "none"), str(tmp_path / "x")], ""),
        ("python -m dear.serve", dear.serve.__main__.main, ["--policy", str(tmp_path / "none")],
         f"--policy: {tmp_path / 'none'}: does not exist"),
        ("python -m dear.serve", dear.serve.__main__.main, ["--encoder", "hashing"],  # the shipped policy's is minilm
         "--encoder: encoder 'hashing' differs from 'minilm'"),
    ]


def test_a_user_error_in_any_cli_is_one_prefixed_line_and_exit_2(tmp_path, capsys):
    for prog, main, argv, start in _user_errors(tmp_path):
        assert exit_code(lambda main=main, argv=argv: main(argv), prog, argv=argv) == 2, prog
        err = capsys.readouterr().err
        assert err.startswith(f"{prog}: error: {start}") and len(err.splitlines()) == 1, err


def _writes_its_own_error_line(node: ast.AST) -> bool:
    """`raise SystemExit("...error...")` or `print("error: ...")`: an error line written beside dear.cli.run."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    name = ast.unparse(node.func)
    text = ast.unparse(node.args[0])
    return (name == "SystemExit" and "error" in text) or (name == "print" and "error:" in text)


def test_no_cli_writes_its_own_error_line():
    """Every user error goes through dear.cli.run, which alone writes `prog: error: ...`."""
    offenders = []
    for top in ("dear", "envs", "train", "eval", "simworld", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == ROOT / "dear" / "cli.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            offenders += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree) if _writes_its_own_error_line(n)]
    assert not offenders, f"error lines written beside dear.cli.run: {offenders}"


# ---------------------------------------------------------------- argparse's mistakes (issue 59 item 6)
def test_a_command_line_mistake_is_one_error_line_and_a_hint_not_the_usage(capsys):
    """Inside every CLI's error path (`exit_code`, so `run`): argparse's error is one line and a hint to --help,
    exit code 2, instead of the usage block that buried the line naming the fix (`--llm locl`)."""
    from dear.infer import PROG, main

    argv = ["--llm", "locl", "--question", "What is 17 * 23?"]
    with pytest.raises(SystemExit) as e:
        exit_code(lambda: main(argv), PROG, argv=argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and not any(line.startswith("usage:") for line in err)
    assert err[0].startswith(f"{PROG}: error: argument --llm: unknown LLM backend spec 'locl'")
    assert err[1] == f"run `{PROG} --help` for usage"
    # a parser's own p.error(...) checks answer the same way
    with pytest.raises(SystemExit):
        exit_code(lambda: main(["--question", "x", "--choice", "a"]), PROG)
    assert capsys.readouterr().err.splitlines()[-1] == f"run `{PROG} --help` for usage"
    # outside a CLI's error path argparse is left as it was
    p = argparse.ArgumentParser(prog="python -m y")
    with pytest.raises(SystemExit):
        p.parse_args(["--nope"])
    assert capsys.readouterr().err.startswith("usage: python -m y")


def test_the_real_entry_point_prints_the_short_error(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "train.happo", "--config", "sim", "--bogus"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["python -m train.happo: error: unrecognized arguments: --bogus",
                                     "run `python -m train.happo --help` for usage"]
