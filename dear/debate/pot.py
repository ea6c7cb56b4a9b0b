"""The program-of-thought (`pot`) reply style: the agent writes a Python program that prints its answer, the
program runs in the sandbox (dear/sandbox.py), and the last non-empty line it printed is read by the task's usual
answer extractor.

- `instructions(kind)`: the format block of a `pot` agent's turns (round 0: `POT_STRUCTURE` plus what to print for
  the question's answer kind); `RECONSIDER_POT` / `RECONSIDER_ALONE_POT`: the single layout's requests to revise.
- `extract_program(completion)`: the program in a completion: its last ```python block (```py, ```python3), else
  its last unlabelled fenced block that parses as Python (one that prints first), else the whole text. A block left open at the end of
  the completion (cut at the token limit) counts up to the end.
- `run_pot(completion, limits)`: extract and run; a `PotRun`: the sandbox's `SandboxResult` (verdict, stdout/stderr
  capped, exit status, run time) plus the code and `answer_text`, the printed output's last non-empty line when
  the program ran to a clean end (verdict ok), else None.
- `pot_answer(completion, question, limits)`: (the extracted answer or None, the `PotRun`). A refused, failed,
  timed-out or silent program is "no answer" for that turn; nothing here raises for anything a program does.
- `shown_parts(run, show_program)`: (reasoning, conclusion) of a `pot` turn as a later prompt shows it.
- `PotRun.from_dict(d)`: a stored run (a trace turn's `program`), for re-grading without running it again.

This module imports no prompt code, so dear/debate/prompts.py can import it to register the style.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, fields

from dear import tasks
from dear.sandbox import DEFAULT_LIMITS, OK, SandboxLimits, SandboxResult, run_program
from dear.tasks.types import Question

STYLE = "pot"
POT_INSTRUCTION = "Write a Python program that computes the answer and prints only the final answer."
POT_STRUCTURE = (
    f"{POT_INSTRUCTION}\n"
    "Reply with the program alone, in one ```python code block. It runs without input, files or network, and may "
    "import only these standard modules: math, fractions, decimal, itertools, functools, statistics, collections, "
    "re, datetime, operator, string, heapq, bisect, cmath, numbers, random. The last line it prints is read as "
    "your answer."
)
# What the program prints, per answer kind (the task extractor reads the printed line).
PRINT_FORMS: dict[str, str] = {
    "numeric": "Print the final answer as a single number without units, for example print(42).",
    "integer": "Print the final answer as a single integer, for example print(42).",
    "math": "Print the final answer in simplest exact form (LaTeX is fine), for example print(r'\\frac{3}{4}').",
    "choice": "Print the letter of the single correct option, for example print('B').",
}
RECONSIDER_POT = (
    "Use the other agents' answers as additional information. Check their programs and your own, then reply with "
    "your updated program."
)
RECONSIDER_ALONE_POT = "Check your previous program, then reply with your updated program."
NOT_SHOWN = "(a Python program, not shown)"

_PYTHON_LANGS = frozenset({"python", "py", "python3", "py3"})
MAX_SHOWN_OUTPUT = 500  # characters of a program's printed output a peer sees


def print_form(kind: str) -> str:
    """What a `pot` program prints for an answer of this kind; ValueError for an unknown kind."""
    if kind not in PRINT_FORMS:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(PRINT_FORMS)}")
    return PRINT_FORMS[kind]


def instructions(kind: str) -> str:
    """The format block that ends a `pot` agent's user turns (round 0 and its exchange turns)."""
    return f"{POT_STRUCTURE}\n{print_form(kind)}"


def prompt_texts(kind: str) -> list[str]:
    """The `pot` style's own prompt text that a completion may repeat (for echo removal, as ReplyStyle's)."""
    return [POT_STRUCTURE, *POT_STRUCTURE.splitlines(), print_form(kind), RECONSIDER_POT, RECONSIDER_ALONE_POT]


# ---------------------------------------------------------------- extraction
@dataclass(frozen=True)
class _Block:
    lang: str
    code: str
    closed: bool


def _blocks(text: str) -> list[_Block]:
    """Fenced blocks (``` lines), in order; one still open at the end runs to the end of the text."""
    out, lang, body, inside = [], "", [], False
    for line in text.splitlines():
        stripped = line.strip()
        if not inside and stripped.startswith("```"):
            info = stripped[3:].strip()
            lang, body, inside = (info.split()[0].lower() if info else ""), [], True
        elif inside and stripped.startswith("```") and not stripped[3:].strip():
            out.append(_Block(lang, "\n".join(body), True))
            inside = False
        elif inside:
            body.append(line)
    if inside:
        out.append(_Block(lang, "\n".join(body), False))
    return out


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def extract_program(completion: str) -> str:
    """The program in a completion (module docstring); "" for an empty completion."""
    text = (completion or "").replace("\r\n", "\n")
    blocks = [b for b in _blocks(text) if b.code.strip()]
    python = [b for b in blocks if b.lang in _PYTHON_LANGS]
    if python:
        return python[-1].code.strip("\n")
    plain = [b for b in blocks if not b.lang and _parses(b.code)]
    printing = [b for b in plain if "print" in b.code]  # a program, not its shown output (```\n42\n```)
    if printing or plain:
        return (printing or plain)[-1].code.strip("\n")
    return text.strip("\n")


def answer_line(stdout: str) -> str | None:
    """The last non-empty line of a program's output, stripped; None when it printed nothing."""
    for line in reversed((stdout or "").splitlines()):
        if line.strip():
            return line.strip()
    return None


# ---------------------------------------------------------------- running
# The sandbox's report fields a trace does not keep (stored runs keep the shape they were first written in).
_NOT_STORED = frozenset({"stdout_truncated", "stderr_truncated"})


@dataclass(frozen=True)
class PotRun(SandboxResult):
    """One `pot` turn's program and what became of it: the sandbox's `SandboxResult` (verdict, output, exit
    status, times, layers, `ok`) plus the program and its answer line (the trace keeps `to_dict()`)."""

    code: str = field(kw_only=True)
    # The printed output's last non-empty line; None unless the program ran cleanly.
    answer_text: str | None = field(kw_only=True)

    def to_dict(self) -> dict:
        """The program, its answer line, then the sandbox's report as `SandboxResult.to_dict` gives it, without
        the truncation flags."""
        report = {k: v for k, v in super().to_dict().items() if k not in _NOT_STORED}
        return {"code": self.code, "answer_text": self.answer_text, **report}

    @classmethod
    def from_dict(cls, d: dict) -> PotRun:
        """A run as `to_dict` stored it (a trace turn's `program`). Its answer line is read again from the stored
        output (today's `answer_line`, for a clean run only), so re-grading a stored turn never runs its program."""
        verdict = str(d.get("verdict", ""))
        stdout = str(d.get("stdout") or "")
        return cls(code=str(d.get("code") or ""), answer_text=answer_line(stdout) if verdict == OK else None,
                   verdict=verdict, reason=str(d.get("reason") or ""), stdout=stdout,
                   stderr=str(d.get("stderr") or ""), exit_status=d.get("exit_status"),
                   wall_seconds=float(d.get("wall_seconds") or 0.0), cpu_seconds=float(d.get("cpu_seconds") or 0.0),
                   layers=tuple(d.get("layers") or ()))


def _run_from(code: str, result: SandboxResult) -> PotRun:
    report = {f.name: getattr(result, f.name) for f in fields(SandboxResult)}
    return PotRun(**report, code=code, answer_text=answer_line(result.stdout) if result.ok else None)


def run_pot(completion: str, limits: SandboxLimits = DEFAULT_LIMITS) -> PotRun:
    """Extract the completion's program and run it in the sandbox. Never raises for the program's doing."""
    code = extract_program(completion)
    return _run_from(code, run_program(code, limits))


def answer_from_run(run: PotRun, question: Question) -> str | None:
    """The task extractor applied to the run's printed answer line; None for no clean run or no answer in it."""
    if run.answer_text is None:
        return None
    return tasks.extract_answer(run.answer_text, question.kind, question.choices)


def pot_answer(completion: str, question: Question,
               limits: SandboxLimits = DEFAULT_LIMITS) -> tuple[str | None, PotRun]:
    """(The `pot` agent's answer or None, its run) for one completion."""
    run = run_pot(completion, limits)
    return answer_from_run(run, question), run


def shown_parts(run: PotRun | None, show_program: bool = True) -> tuple[str, str]:
    """(reasoning, conclusion) of a `pot` turn in a later prompt: the program (or `NOT_SHOWN`), then what it
    printed or why it gave no answer."""
    if run is None:
        return NOT_SHOWN, "The program did not run."
    reasoning = f"```python\n{run.code}\n```" if show_program and run.code.strip() else NOT_SHOWN
    if run.ok and run.answer_text is not None:
        shown = run.answer_text
        if len(shown) > MAX_SHOWN_OUTPUT:
            shown = shown[:MAX_SHOWN_OUTPUT] + "..."
        return reasoning, f"The program printed: {shown}"
    if run.ok:
        return reasoning, "The program printed nothing."
    return reasoning, f"The program gave no answer ({run.verdict}: {run.reason[:200]})."
