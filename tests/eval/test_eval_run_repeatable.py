"""`eval.run --repeatable` with agent profiles on several backends (issue 59 item 4): the one-slot repeatable setting
reaches every llama.cpp backend, also one that only a profile names, and no other backend (a bank or the sim repeat
anyway and take no llama.cpp option)."""

from __future__ import annotations

from eval import methods as M
from eval import run as R

REPEATABLE = {"n_parallel": 1, "repeatable": True}


def settings_options(*args: str) -> dict:
    a = R.parse_args(["--benchmarks", "gsm8k", "--methods", "mad", "--out", "unused", "--repeatable", *args])
    return R.settings_from_args(a, None, M.parse_methods("mad")).backend_options


def test_a_llama_profile_on_a_sim_or_bank_run_decodes_repeatably_and_the_others_take_nothing():
    for llm in ("sim", "bank"):
        options = settings_options("--llm", llm, "--agent-profiles", "cot,cot,smoke:cot")
        assert options == REPEATABLE  # recorded in run.json's settings
        assert R.options_for("smoke", llm, options) == REPEATABLE
        assert R.options_for(llm, llm, options) == {}


def test_the_llama_llm_itself_keeps_the_setting():
    assert R.options_for("smoke", "smoke", REPEATABLE) == REPEATABLE
    assert R.options_for("local", "smoke", {**REPEATABLE, "n_ctx": 2048}) == {**REPEATABLE, "n_ctx": 2048}
