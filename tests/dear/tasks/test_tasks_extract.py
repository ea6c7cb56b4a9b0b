"""Answer extraction and normalisation on real-looking model output, plus the prompt formats."""

from __future__ import annotations

import pytest

from dear.tasks import (
    Question,
    extract_answer,
    format_instruction,
    grade,
    load,
    normalize_answer,
    render_question,
)
from dear.tasks.prompts import format_example

# (text, kind, expected extraction)
CASES = [
    # boxes
    ("So the total is \\boxed{18}.", "numeric", "18"),
    ("First \\boxed{12}, but correcting: \\boxed{18}", "numeric", "18"),  # last box wins
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "math", "\\frac{\\sqrt{3}}{2}"),  # nested braces
    ("The answer is \\boxed 5.", "numeric", "5"),  # \boxed without braces
    ("$\\boxed5$", "math", "5"),
    ("\\boxed{5} then the output stops \\boxed{6", "numeric", "5"),  # truncated last box
    ("\\fbox{42}", "integer", "42"),
    ("\\boxed{\\$1,000}", "numeric", "1000"),
    ("\\boxed{1,000 \\text{ dollars}}", "numeric", "1000"),
    ("\\boxed{x = -3}", "numeric", "-3"),
    ("\\boxed{5 \\times 3 = 15}", "numeric", "15"),
    ("\\boxed{\\dfrac{7}{2}}", "numeric", "7/2"),
    ("\\boxed{−4}", "numeric", "-4"),
    ("\\boxed{\\text{(B)}}", "choice", "B"),
    ("\\boxed{B}", "choice", "B"),
    ("\\boxed{(c)}", "choice", "C"),
    ("\\boxed{\\textbf{D) 12 kg}}", "choice", "D"),
    ("\\boxed{\\left[ -2, 5 \\right)}", "math", "\\left[ -2, 5 \\right)"),
    ("\\boxed{\\{1\\pm\\sqrt{5},-2\\}}", "math", "\\{1\\pm\\sqrt{5},-2\\}"),  # escaped braces are not groups
    ("\\boxed{}", "math", None),
    # phrases
    ("The answer is 18.", "numeric", "18"),
    ("The answer is $18.00.", "numeric", "18.00"),
    ("Answer: 1,234,567", "numeric", "1234567"),
    ("Final answer: -0.5 meters.", "numeric", "-0.5"),
    ("**Final Answer:** 72 clips", "numeric", "72"),
    ("**Final Answer**: $\\frac{14}{3}$", "math", "\\frac{14}{3}"),
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "numeric", "72"),
    ("Final answer:\n\n25%", "numeric", "25"),
    ("The final answer is $x^2 + 1$. I hope it is correct.", "math", "x^2 + 1"),
    ("Final answer: (3, \\frac{\\pi}{2})", "math", "(3, \\frac{\\pi}{2})"),
    ("The answer is (B).", "choice", "B"),
    ("The correct answer is: **(D)**", "choice", "D"),
    ("Answer: B) Paris", "choice", "B"),
    ("Final answer: B.", "choice", "B"),
    ("The answer is C because the others are wrong.", "choice", "C"),
    ("Answer: Option A", "choice", "A"),
    # bare lines and fallbacks
    ("18", "numeric", "18"),
    ("She has 16 - 3 - 4 = 9 eggs left, so she makes 9 * 2 = 18 dollars.", "numeric", "18"),  # last number
    ("B", "choice", "B"),
    ("**B**", "choice", "B"),
    ("Looking at the options...\n(C)", "choice", "C"),
    ("Let's see.\nB. 12 kg", "choice", "B"),
    ("\\frac{3}{4}", "math", "\\frac{3}{4}"),
    ("$\\frac{3}{4}$", "math", "\\frac{3}{4}"),
    # no answer
    ("", "numeric", None),
    ("   \n ", "choice", None),
    ("I don't know.", "numeric", None),
    ("I don't know.", "choice", None),
    ("I don't know the answer to this one.", "math", None),
    ("I think it depends.", "choice", None),
    ("The answer is unclear.", "choice", None),
]


@pytest.mark.parametrize("text,kind,expected", CASES)
def test_extract(text, kind, expected):
    assert extract_answer(text, kind) == expected


def test_choice_given_as_option_text_maps_to_letter():
    choices = ("Paris", "London", "Rome")
    assert extract_answer("The answer is London.", "choice", choices) == "B"
    assert extract_answer("\\boxed{\\text{Rome}}", "choice", choices) == "C"
    assert extract_answer("The answer is Berlin.", "choice", choices) is None


NORMALIZE = [
    ("1,000", "numeric", "1000"),
    ("$5.00", "numeric", "5"),
    ("\\$5.50", "numeric", "5.5"),
    ("-0.50", "numeric", "-0.5"),
    ("1/3", "numeric", "0.333333333333"),
    ("0.333333333333", "numeric", "0.333333333333"),
    ("\\frac{1}{2}", "numeric", "0.5"),
    ("18 eggs", "numeric", "18"),
    ("eighteen", "numeric", "eighteen"),
    ("025", "integer", "25"),
    ("b", "choice", "B"),
    ("(b)", "choice", "B"),
    ("\\text{(B)}", "choice", "B"),
    ("no", "choice", None),
    ("\\dfrac{1}{2}", "math", "\\frac{1}{2}"),
    ("\\frac12", "math", "\\frac{1}{2}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "math", "(3,\\frac{\\pi}{2})"),
    ("x = 3", "math", "3"),
    ("1,000", "math", "1000"),
    ("90^\\circ", "math", "90"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "math", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("3.", "math", "3"),
    ("", "math", None),
    (None, "numeric", None),
]


@pytest.mark.parametrize("answer,kind,expected", NORMALIZE)
def test_normalize(answer, kind, expected):
    assert normalize_answer(answer, kind) == expected


def test_voting_keys_agree_across_spellings():
    spellings = ["\\boxed{1,000}", "The answer is $1000.", "Final answer: 1000.00 dollars", "#### 1000"]
    assert {normalize_answer(extract_answer(s, "numeric"), "numeric") for s in spellings} == {"1000"}
    letters = ["\\boxed{B}", "The answer is (B).", "**B**", "Answer: b)", "\\boxed{\\text{(B)}}"]
    assert {normalize_answer(extract_answer(s, "choice"), "choice") for s in letters} == {"B"}


def test_unknown_kind_is_an_error_not_none():
    with pytest.raises(ValueError, match="unknown answer kind 'essay'"):
        extract_answer("5", "essay")
    with pytest.raises(ValueError, match="unknown answer kind"):
        normalize_answer("5", "essay")
    with pytest.raises(ValueError, match="unknown answer kind"):
        format_instruction("essay")


# ---------------------------------------------------------------- Qwen-style outputs
QWEN_GSM = """To determine how much Janet makes every day at the farmers' market, we need to follow these steps:

1. **Calculate the total number of eggs laid per day:**
   Janet's ducks lay 16 eggs per day.

2. **Calculate the number of eggs Janet eats for breakfast and uses for baking:**
   - She eats 3 eggs for breakfast.
   - She uses 4 eggs for baking muffins.
   - Total eggs used: \\(3 + 4 = 7\\) eggs.

3. **Calculate the number of eggs left to sell:**
   \\[
   16 - 7 = 9 \\text{ eggs}
   \\]

4. **Calculate the total earnings from selling the remaining eggs:**
   \\[
   9 \\times 2 = 18 \\text{ dollars}
   \\]

Therefore, Janet makes \\(\\boxed{18}\\) dollars every day at the farmers' market."""

QWEN_MATH = """To convert the point \\((0, 3)\\) from rectangular coordinates to polar coordinates, we use
\\[ r = \\sqrt{x^2 + y^2} = \\sqrt{0^2 + 3^2} = 3 \\]
Since \\(x = 0\\) and \\(y > 0\\), the point lies on the positive \\(y\\)-axis, so \\(\\theta = \\frac{\\pi}{2}\\).

Therefore, the polar coordinates are:
\\[
\\boxed{\\left(3, \\frac{\\pi}{2}\\right)}
\\]"""

QWEN_CHOICE = """Reasoning: A meteorite impact that changes the planet's rotation would most directly affect the
length of a day, since a day is one rotation.
Conclusion: The length of a day would change.
Final answer: \\boxed{C}"""

QWEN_STRUCTURED = """Reasoning: Each box holds 12 cookies and there are 7 boxes, so 12 * 7 = 84. She gives away 20, leaving 64.
Conclusion: She has 64 cookies left.
Final answer: 64"""


def test_qwen_style_outputs_extract_and_grade():
    gsm = load("gsm8k")[0]
    assert extract_answer(QWEN_GSM, "numeric") == "18"
    assert grade(extract_answer(QWEN_GSM, gsm.kind), gsm).correct
    m = load("math500")[0]
    pred = extract_answer(QWEN_MATH, "math")
    assert pred == "\\left(3, \\frac{\\pi}{2}\\right)"
    assert (
        grade(pred, m) == grade(pred, m) and grade(pred, m).correct and grade(pred, m).grader == "math-verify"
    )
    arc = load("arc_challenge")[0]
    assert grade(extract_answer(QWEN_CHOICE, "choice"), arc).correct
    assert extract_answer(QWEN_STRUCTURED, "numeric") == "64"


# ---------------------------------------------------------------- prompts
def test_format_instruction_per_kind():
    for kind in ("numeric", "integer", "math"):
        assert "\\boxed{" in format_instruction(kind) and "step by step" in format_instruction(kind)
    assert "letter" in format_instruction("choice")
    # The instruction's example is a well-formed answer of its kind, but the echoed instruction is no answer.
    for kind in ("choice", "math", "numeric", "integer"):
        example = format_example(kind)
        assert f"for example \\boxed{{{example}}}." in format_instruction(kind)
        assert extract_answer(f"\\boxed{{{example}}}", kind) == example
        assert extract_answer(format_instruction(kind), kind) is None
        own = f"\nSo the answer is \\boxed{{{example}}}."
        assert extract_answer(format_instruction(kind) + own, kind) == example


def test_render_question_lists_lettered_options():
    qn = Question("1", "t", "Which is a fruit?", "B", "choice", ("rock", "apple", "car"))
    assert render_question(qn) == "Which is a fruit?\n\nOptions:\nA) rock\nB) apple\nC) car"
    plain = load("gsm8k")[0]
    assert render_question(plain) == plain.question
    mmlu = load("mmlu_pro_health")[0]
    assert render_question(mmlu).endswith("G) Use of antiviral drugs")


# ---------------------------------------------------------------- recorded embedded-model output
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M (the embedded model), temperature 0, prompt = render_question + format_instruction,
# max_tokens 320; generated for these tests. The ARC answer hit the token limit before answering.
REAL_GSM8K_1 = "To determine the total number of bolts of fiber needed for the robe, we need to follow these steps:\n\n1. Identify the number of bolts of blue fiber required.\n2. Calculate the number of bolts of white fiber required.\n3. Add the number of bolts of blue fiber and white fiber together to get the total number of bolts.\n\nStep 1: Identify the number of bolts of blue fiber required.\nThe problem states that the robe takes 2 bolts of blue fiber.\n\nStep 2: Calculate the number of bolts of white fiber required.\nThe problem also states that the robe takes half as much white fiber as blue fiber. Therefore, the number of bolts of white fiber is:\n\\[\n\\frac{2}{2} = 1\n\\]\n\nStep 3: Add the number of bolts of blue fiber and white fiber together to get the total number of bolts.\nThe total number of bolts is:\n\\[\n2 + 1 = 3\n\\]\n\nThus, the total number of bolts of fiber needed is \\boxed{3}."
REAL_MATH500_NT572 = "To determine the number of positive whole-number divisors of 196, we start by finding its prime factorization. The number 196 can be factored as follows:\n\n\\[ 196 = 2^2 \\times 7^2 \\]\n\nThe formula to find the number of positive whole-number divisors of a number \\( n = p_1^{e_1} \\times p_2^{e_2} \\times \\cdots \\times p_k^{e_k} \\) is given by:\n\n\\[ (e_1 + 1)(e_2 + 1) \\cdots (e_k + 1) \\]\n\nFor the number 196, the exponents are 2 and 2. Applying the formula, we get:\n\n\\[ (2 + 1)(2 + 1) = 3 \\times 3 = 9 \\]\n\nTherefore, the number of positive whole-number divisors of 196 is \\(\\boxed{9}\\)."
REAL_ARC_TRUNCATED = "To determine the most likely effect of a meteorite impact on a planet's rotation, let's analyze each option step by step:\n\nA) Planetary density will decrease.\n- A meteorite impact can cause significant changes in the planet's structure and composition. If the impact is large enough, it can cause the planet's core to melt or even completely vaporize. This would result in a decrease in the planet's density, which is not a likely effect of a meteorite impact.\n\nB) Planetary years will become longer.\n- A meteorite impact can cause significant changes in the planet's rotation. If the impact is large enough, it can cause the planet's axis to tilt more significantly. This would result in a longer period of time for the planet to complete one full rotation, which would be considered a longer planetary year.\n\nC) Planetary days will become shorter.\n- A meteorite impact can cause significant changes in the planet's rotation. If the impact is large enough, it can cause the planet's axis to tilt more significantly. This would result in a shorter period of time for the planet to complete one full rotation, which would be considered a shorter planetary day.\n\nD) Planetary gravity will become stronger.\n- A meteorite impact can cause significant changes in the planet's rotation. If the impact is large enough, it can cause the planet's axis to tilt more significantly. This would result in a stronger gravitational field, which is not a likely effect of a meteorite impact.\n\nBased on the analysis, the most likely effect of a meteorite impact on a planet's rotation"


def test_recorded_embedded_model_outputs():
    gsm = load("gsm8k")[1]
    assert extract_answer(REAL_GSM8K_1, "numeric") == "3"
    assert grade("3", gsm) == grade(extract_answer(REAL_GSM8K_1, gsm.kind), gsm)
    assert grade("3", gsm).correct
    m = next(q for q in load("math500") if q.id == "test/number_theory/572.json")
    pred = extract_answer(REAL_MATH500_NT572, m.kind)
    assert pred == "9" and grade(pred, m).correct and grade(pred, m).grader == "math-verify"
    # Truncated while listing "A) ... D) ..." options: no answer, and not the last option label it saw.
    arc = load("arc_challenge")[0]
    assert extract_answer(REAL_ARC_TRUNCATED, "choice", arc.choices) is None
    assert grade(None, arc).grader == "none"
