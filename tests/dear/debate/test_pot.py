"""The program-of-thought reply style's parsing and running (dear/debate/pot.py, issue 58)."""

from __future__ import annotations

import pytest

from dear.debate import pot
from dear.sandbox import ERROR, OK, REFUSED, TIMEOUT, SandboxLimits
from dear.tasks.types import Question

L = SandboxLimits(wall_seconds=2.0, cpu_seconds=1.0, memory_mb=128, max_output_bytes=4096)
GSM = Question("q1", "gsm8k", "Janet has 3 apples and buys 15 more. How many?", "18", "numeric")
CHOICE = Question("q2", "mmlu", "Pick one.", "C", "choice", ("red", "green", "blue", "black"))

PROGRAM = "apples = 3 + 15\nprint(apples)"


@pytest.mark.parametrize("completion, expected", [
    (f"```python\n{PROGRAM}\n```", PROGRAM),
    (f"Here is my program:\n\n```Python\n{PROGRAM}\n```\nIt prints 18.", PROGRAM),
    (f"```py\n{PROGRAM}\n```", PROGRAM),
    (f"  ```python3 title=solve.py\n{PROGRAM}\n  ```", PROGRAM),
    (PROGRAM, PROGRAM),  # no fence: the whole text
    (f"\n\n{PROGRAM}\n\n", PROGRAM),
    (f"```\n{PROGRAM}\n```\nOutput:\n```\n18\n```", PROGRAM),  # unlabelled: the block that prints, not its output
    ("```python\nprint(1)\n```\nWait, that is wrong. Fixed:\n```python\nprint(2)\n```", "print(2)"),  # the last
    (f"Agent 1's program:\n```text\nnot python\n```\n```python\n{PROGRAM}\n```", PROGRAM),
    ("```python\nx = 1\nprint(x", "x = 1\nprint(x"),  # cut at the token limit: the open block to the end
    ("", ""),
])
def test_extract_program(completion, expected):
    assert pot.extract_program(completion) == expected


@pytest.mark.parametrize("stdout, line", [("18\n", "18"), ("step 1\n\n 18 \n\n", "18"), ("", None), ("\n \n", None),
                                          ("a\nThe answer is 7\n", "The answer is 7")])
def test_answer_line(stdout, line):
    assert pot.answer_line(stdout) == line


def test_a_program_that_prints_the_answer_answers():
    answer, run = pot.pot_answer(f"Sure.\n```python\n{PROGRAM}\n```", GSM, L)
    assert answer == "18" and run.ok and run.verdict == OK and run.answer_text == "18"
    assert run.code == PROGRAM and run.stdout == "18\n" and run.exit_status == 0 and run.wall_seconds > 0
    d = run.to_dict()
    assert d["code"] == PROGRAM and d["verdict"] == OK and d["stdout"] == "18\n" and "layers" in d


def test_the_task_extractor_reads_the_last_printed_line():
    answer, _ = pot.pot_answer("```python\nprint('working...')\nprint('Total: $1,018.00')\n```", GSM, L)
    assert answer == "1018.00"
    answer, _ = pot.pot_answer("```python\nprint('C')\n```", CHOICE, L)
    assert answer == "C"
    answer, _ = pot.pot_answer("```python\nprint('Z')\n```", CHOICE, L)
    assert answer is None  # no option Z


@pytest.mark.parametrize("completion, verdict", [
    ("```python\nprint(1 / 0)\n```", ERROR),
    ("```python\nimport os\nprint(os.getcwd())\n```", REFUSED),
    ("```python\nprint(18)\nwhile True:\n    pass\n```", TIMEOUT),  # printed, then never finished
    ("```python\nx = (\n```", REFUSED),
    ("I think the answer is 18.", REFUSED),  # prose is no program
])
def test_a_failed_or_refused_program_is_no_answer(completion, verdict):
    answer, run = pot.pot_answer(completion, GSM, L)
    assert answer is None and run.answer_text is None and run.verdict == verdict, run


def test_a_program_that_prints_nothing_is_no_answer():
    answer, run = pot.pot_answer("```python\nx = 18\n```", GSM, L)
    assert answer is None and run.verdict == OK and run.answer_text is None


def test_instructions_and_shown_parts():
    text = pot.instructions("numeric")
    assert text.startswith(pot.POT_INSTRUCTION) and "```python" in text and "print(42)" in text
    assert "print('B')" in pot.instructions("choice")
    with pytest.raises(ValueError):
        pot.instructions("essay")
    assert pot.POT_STRUCTURE in pot.prompt_texts("math")
    run = pot.run_pot(f"```python\n{PROGRAM}\n```", L)
    reasoning, conclusion = pot.shown_parts(run)
    assert PROGRAM in reasoning and conclusion == "The program printed: 18"
    assert pot.shown_parts(run, show_program=False)[0] == pot.NOT_SHOWN
    failed = pot.run_pot("```python\nimport os\n```", L)
    assert "no answer" in pot.shown_parts(failed)[1] and "refused" in pot.shown_parts(failed)[1]
