"""Fuzz: >= 10,000 random and adversarial strings through extract -> normalize -> grade, with zero exceptions."""

from __future__ import annotations

import random
import time

from dear.tasks import Question, extract_answer, grade, normalize_answer

FRAGMENTS = [
    "\\boxed{",
    "\\boxed",
    "\\boxed ",
    "\\fbox{",
    "}",
    "{",
    "{{",
    "}}",
    "\\{",
    "\\}",
    "\\\\",
    "\\",
    "$",
    "$$",
    "\\(",
    "\\)",
    "\\[",
    "\\]",
    "\\frac",
    "\\dfrac{",
    "\\frac12",
    "\\sqrt{",
    "^",
    "_",
    "\\text{",
    "\\text{(B)}",
    "\\textbf{",
    "\\left(",
    "\\right)",
    "\\circ",
    "\\%",
    "%",
    "\\$",
    "\\pi",
    "\\infty",
    "\\cup",
    "\\pm",
    "\\begin{pmatrix}",
    "\\end{pmatrix}",
    "&",
    "=",
    "x =",
    "<",
    ">",
    "\\le",
    "!",
    "(",
    ")",
    "[",
    "]",
    ",",
    ".",
    ":",
    ";",
    "-",
    "+",
    "*",
    "/",
    "**",
    "__",
    "#### ",
    "The answer is ",
    "the answer is: ",
    "Answer:",
    "**Final Answer:**",
    "Final answer: ",
    "answer =",
    "(B)",
    "B)",
    "**B**",
    "B.",
    "(b)",
    "Option C",
    "A",
    "I",
    "J",
    "Z",
    "0",
    "1",
    "025",
    "1,000",
    "1,0",
    ",000",
    "3.14",
    ".5",
    "5.",
    "-7",
    "−3",
    "1e400",
    "9" * 80,
    "9^{9^{9}}",
    "2^{2^{30}}",
    "1000000!",
    "10^{10^{100}}",
    "\\binom{100000}{50000}",
    "\\sum_{n=1}^{10^9}",
    "NaN",
    "inf",
    "None",
    "null",
    "\n",
    "\n\n",
    "\t",
    " ",
    "   ",
    "é",
    "中文",
    "∞",
    "½",
    "١٢٣",
    "\x00",
    "\ufeff",
    "\u200b",
    "🙂",
    "\\u0000",
    "'",
    '"',
    "`",
    "```",
    "eggs",
    "dollars",
    "per hour",
    "\\mathrm{cm}",
    "\\mbox{ inches}^2",
    "\\operatorname{",
    "\\displaystyle",
    "\\!",
    "\\,",
]

ADVERSARIAL = [
    "",
    "\\boxed{" * 3000,
    "}" * 3000,
    "{" * 200 + "1" + "}" * 200,
    "(" * 60 + "1" + ")" * 60,
    "\\boxed{" + "{" * 46 + "1" + "}" * 46 + "}",
    "\\boxed{" + "9" * 5000 + "}",
    "The answer is " + "1," * 3000,
    "Answer: " * 2000,
    "$" * 5001,
    "\\frac{" * 500,
    "#### " + "-" * 1000,
    "(" + "A" * 10000 + ")",
    "x" * 100000,
    "\\boxed{\\boxed{\\boxed{5}}}",
    "\\boxed{}",
    "\\boxed{ }",
    "\\boxed",
    "\\boxed{9^{9^{9}}}",
    "\\boxed{10^{10^{100}}}",
    "\\boxed{1000000!}",
    "\\boxed{\\frac{1}{0}}",
    "\\boxed{0/0}",
    "The answer is 1/0.",
    "Final answer: \\text{(" + ")" * 100,
    "\\boxed{\\text{(}}",
    "\\begin{pmatrix}" * 50,
    "\\left(" * 100 + "1" + "\\right)" * 100,
    "\ud800",  # lone surrogate
]


def _random_string(rng: random.Random) -> str:
    mode = rng.random()
    if mode < 0.6:
        return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 25)))
    if mode < 0.8:
        return "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 60)))
    if mode < 0.95:  # a plausible model answer with a mutated ending
        body = rng.choice(["Let me think step by step.\n", "Reasoning: 3*6 = 18.\nConclusion: 18.\n", ""])
        tail = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 8)))
        return body + rng.choice(["Final answer: ", "The answer is ", "\\boxed{", "Answer: ("]) + tail
    return rng.choice(ADVERSARIAL)


QUESTIONS = [
    Question("n", "t", "?", "18", "numeric"),
    Question("h", "t", "?", "-3244047.1", "numeric"),
    Question("i", "t", "?", "025", "integer"),
    Question("m1", "t", "?", "\\frac{1}{2}", "math"),
    Question("m2", "t", "?", "\\left( 3, \\frac{\\pi}{2} \\right)", "math"),
    Question("m3", "t", "?", "[1,2)", "math"),
    Question("c", "t", "?", "B", "choice", ("red", "blue", "green", "white")),
]


def test_fuzz_extract_normalize_grade_never_raise():
    rng = random.Random(20240611)
    strings = ADVERSARIAL + [_random_string(rng) for _ in range(10_500)]
    assert len(strings) >= 10_000
    start = time.monotonic()
    graders: dict[str, int] = {}
    for k, s in enumerate(strings):
        question = QUESTIONS[k % len(QUESTIONS)]
        kind = question.kind
        ans = extract_answer(s, kind, question.choices)
        assert ans is None or (isinstance(ans, str) and ans.strip()), (s, ans)
        key = normalize_answer(ans, kind)
        assert key is None or isinstance(key, str)
        # Also feed the raw string straight to normalize and grade: other modules may pass anything. (Only every
        # fourth one for math: math-verify's parser takes ~10 ms per junk string.)
        normalize_answer(s, kind)
        preds = (ans, s) if kind != "math" or k % 4 == 0 else (ans,)
        for pred in preds:
            r = grade(pred, question)
            assert isinstance(r.correct, bool) and r.grader in (
                "numeric",
                "integer",
                "choice",
                "math-verify",
                "string",
                "none",
            )
            graders[r.grader] = graders.get(r.grader, 0) + 1
        if kind == "choice" and key is not None:
            assert len(key) == 1 and key.isupper()
    elapsed = time.monotonic() - start
    assert elapsed < 90, f"fuzz took {elapsed:.1f}s"
    assert graders.get("math-verify", 0) > 100  # the fuzz really reaches math-verify


def test_non_string_inputs_are_no_answer():
    for bad in (None, 5, b"\\boxed{5}", ["5"]):
        assert extract_answer(bad, "numeric") is None  # type: ignore[arg-type]
        assert normalize_answer(bad, "numeric") is None  # type: ignore[arg-type]
        assert grade(bad, QUESTIONS[0]).grader == "none"  # type: ignore[arg-type]
