"""`python -m dear.debate` end to end on the synthetic debater backend (real parts, no language model: fast)."""

from __future__ import annotations

import re
import subprocess
import sys

from dear.cli import exit_code
from dear.debate import read_jsonl
from dear.debate.__main__ import ERRORS, PROG, main


def cli(argv: list[str]) -> int:
    """The exit code of `python -m dear.debate ARGV`, its error line on stderr (dear.cli.run without exiting)."""
    return exit_code(lambda: main(argv), PROG, errors=ERRORS, argv=argv)


def test_cli_sim_mad_prints_results_and_writes_traces(tmp_path, capsys):
    out = tmp_path / "traces.jsonl"
    code = main(["--task", "synthetic", "--n", "12", "--protocol", "mad", "--llm", "sim", "--n-agents", "3",
                 "--n-rounds", "2", "--no-cache", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert len(re.findall(r"^\[\d+/12\] ", text, re.MULTILINE)) == 12
    acc = float(re.search(r"accuracy\s+([0-9.]+)", text).group(1))
    assert 0.0 <= acc <= 1.0
    assert re.search(r"failures\s+0", text) and "tokens/question" in text and "wall time" in text
    traces = read_jsonl(out)
    assert len(traces) == 12 and all(len(t.rounds) == 3 for t in traces)
    assert sum(t.final_correct for t in traces) == round(acc * 12)
    assert all(t.masks()[1].sum() == 6 for t in traces)  # MAD: full mesh


def test_cli_majority_and_cache(tmp_path, capsys):
    argv = ["--task", "synthetic", "--n", "5", "--protocol", "majority", "--llm", "sim",
            "--cache", str(tmp_path / "c.sqlite")]
    assert main(argv) == 0
    assert re.search(r"cache hits\s+0/15", capsys.readouterr().out)
    assert main(argv) == 0
    assert re.search(r"cache hits\s+15/15", capsys.readouterr().out)  # second run: no model calls


def test_cli_module_entry_point_and_bad_protocol():
    res = subprocess.run([sys.executable, "-m", "dear.debate", "--task", "synthetic", "--n", "2", "--llm", "sim",
                          "--protocol", "nope", "--no-cache"], capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode != 0 and "unknown protocol" in res.stderr


def test_cli_out_is_checked_before_any_debate(tmp_path, capsys):
    assert cli(["--task", "synthetic", "--n", "3", "--llm", "sim", "--no-cache", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "questions, protocol" not in captured.out  # refused before the debates started
    assert "python -m dear.debate: error: --out" in captured.err and "is a directory" in captured.err
    (tmp_path / "f").write_text("")
    assert cli(["--task", "synthetic", "--n", "3", "--llm", "sim", "--no-cache",
                "--out", str(tmp_path / "f" / "t.jsonl")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_cli_user_errors_are_one_line_and_exit_2_traceback_only_with_v(capsys):
    assert cli(["--task", "gpqa_x", "--llm", "sim"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m dear.debate: error: unknown task 'gpqa_x'") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert cli(["--task", "gpqa_x", "--llm", "sim", "-v"]) == 2
    assert "Traceback" in capsys.readouterr().err
    assert cli(["--task", "synthetic", "--llm", "sim,sim", "--n-agents", "3"]) == 2
    assert "--llm lists 2 specs" in capsys.readouterr().err


def test_cli_agent_profiles_give_each_agent_its_backend_style_and_limit(tmp_path, capsys):
    out = tmp_path / "traces.jsonl"
    argv = ["--task", "synthetic", "--n", "2", "--protocol", "mad", "--llm", "sim", "--n-rounds", "1", "--no-cache"]
    assert main([*argv, "--agent-profiles", "cot,sim:direct:24", "--out", str(out)]) == 0
    assert "agents=2 (sim:cot, sim:direct:24)" in capsys.readouterr().out  # the list sets --n-agents
    traces = read_jsonl(out)
    assert len(traces) == 2 and all([t.profile for t in turns] == ["sim:cot", "sim:direct:24"] and
                                    [t.max_tokens for t in turns] == [512, 24] for tr in traces for turns in tr.rounds)
    for bad, message in ((["--agent-profiles", "cot,cot", "--n-agents", "3"],
                          "--agent-profiles lists 2 agents but --n-agents is 3"),
                         (["--llm", "sim,sim", "--agent-profiles", "cot,cot"],
                          "--llm must be one spec with --agent-profiles")):
        assert cli([*argv, *bad]) == 2
        assert f"python -m dear.debate: error: {message}" in capsys.readouterr().err


def test_task_aliases():
    from dear import tasks

    (q,) = tasks.load("gpqa", n=1)
    assert q.task == "gpqa_diamond" and tasks.canonical_task("math") == "math500"
