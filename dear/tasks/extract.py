"""Answer extraction from raw model output and the canonical answer keys used for voting.

`extract_answer` looks, in order, at: the last complete `\\boxed{...}` (nested braces; also `\\boxed 5` and
`\\fbox`), the last "Final answer: ... / The answer is ... / Answer: ... / #### ..." phrase, then a kind-specific
fallback (last number for numeric/integer, a letter on the last line for choice, a bare formula for math).
Before that it removes every echo of the format instruction's example phrase ("for example \\boxed{42}", see
`FORMAT_EXAMPLES`): a model that repeats its prompt has not answered 42 by it (a box holding 42 elsewhere counts).
With the question's `choices`, a letter must name one of its options (A.. for that many options): the last marked
letter outside them (an `E` on a four-option question) makes the answer None rather than an earlier letter.
It never raises: anything unusable gives None.

`normalize_answer` maps an extracted answer to the key that plurality voting compares, so `1,000`, `$1000.00` and
`1000` vote together; graders work on the same keys. All regexes here are linear (no nested quantifiers) so
adversarial model output cannot make them backtrack for long.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation, localcontext
from fractions import Fraction

from dear.tasks.types import AnswerKind

KINDS: tuple[str, ...] = ("numeric", "integer", "math", "choice")

# The example answer each kind's format instruction shows ("..., for example \\boxed{42}."); the instruction in
# dear.tasks.prompts is built from it, and extraction ignores the example where it stands in that phrase.
FORMAT_EXAMPLES: dict[str, str] = {"numeric": "42", "integer": "42", "math": "\\frac{3}{4}", "choice": "B"}

# Longest number token we turn into a value: longer ones are garbage, and Python refuses int <-> str
# conversions past 4300 digits.
_MAX_NUMBER_CHARS = 64
_SIG_DIGITS = 12  # significant digits of a non-integer key: 1/3 and 0.333333333333 share a key

# ---------------------------------------------------------------- locating the answer text
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")
_PHRASE = re.compile(
    r"(?:\bfinal\s+answer|\banswer)\s*[*_]*\s*(?:is\b|:|：|=)\s*[*_]*\s*(?::\s*)?|####\s*",
    re.IGNORECASE,
)
_MATH_DELIMS = re.compile(r"^\s*(?:\$\$|\$|\\\(|\\\[)(.*?)(?:\$\$|\$|\\\)|\\\])", re.DOTALL)


def _matching_braces(text: str) -> dict[int, int]:
    """Map the index of every `{` to its matching `}` in one pass; `\\{` and `\\}` are literal braces."""
    match: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # skip the escaped character (\{, \}, \\)
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            match[stack.pop()] = i
        i += 1
    return match


def _boxed_contents(text: str) -> list[str]:
    """Contents of every complete box, in order. An unclosed box (truncated output) is skipped."""
    out: list[str] = []
    braces: dict[int, int] | None = None
    for m in _BOX.finditer(text):
        start = m.end()
        if start < len(text) and text[start] == "{":
            if braces is None:
                braces = _matching_braces(text)
            end = braces.get(start)
            if end is not None:
                out.append(text[start + 1 : end])
        else:
            # `\boxed 5` / `\boxed5.`: TeX takes one token; we take up to whitespace or a math delimiter.
            tok = re.match(r"[^\s$\\]+", text[start:])
            if tok:
                out.append(tok.group(0))
    return [c for c in out if c.strip()]


# "for example \\boxed{EX}" (also "e.g." and spacing variants), EX the kind's format example.
_EXAMPLE_PHRASES: dict[str, re.Pattern[str]] = {
    kind: re.compile(
        r"(?:\bfor\s+example|\be\.g\.)[ \t,:]*\$?\\boxed\s*\{\s*" + re.escape(example) + r"\s*\}\$?", re.IGNORECASE
    )
    for kind, example in FORMAT_EXAMPLES.items()
}


def drop_format_example(text: str, kind: str) -> str:
    """`text` without the format instruction's example phrase ("for example \\boxed{B}"), wherever it is echoed."""
    return _EXAMPLE_PHRASES[kind].sub(" ", text)


def _phrase_answer(text: str) -> str | None:
    """The text after the last answer phrase: the rest of its line, or the next non-empty line."""
    last = None
    for match in _PHRASE.finditer(text):
        last = match
    if last is None:
        return None
    rest = text[last.end() :]
    for line in rest.splitlines():
        if line.strip():
            return line.strip()
    return None


def _last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


# ---------------------------------------------------------------- light LaTeX clean-up
_TEXT_CMDS = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname|emph)\s*\{([^{}]*)\}")
# A matrix row break (two backslashes) is matched first so its second backslash is not read as a spacing command.
_SPACING = re.compile(r"\\\\|\\[,;:! ]|\\quad|\\qquad|\\displaystyle|\\left|\\right|~")


def _drop_spacing(s: str, rep: str) -> str:
    return _SPACING.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else rep, s)


def _strip_text_cmds(s: str) -> str:
    return _TEXT_CMDS.sub(r"\1", s)


def _unwrap(s: str) -> str:
    """Drop markdown emphasis, math delimiters and trailing sentence punctuation around an answer."""
    s = s.strip().strip("*_` ").strip()
    m = _MATH_DELIMS.match(s)
    if m and m.group(1).strip():
        s = m.group(1)
    s = s.replace("$", "")
    s = s.strip().strip("*_` ").strip()
    while s and s[-1] in ".;,!" and not s.endswith("\\!"):
        s = s[:-1].rstrip()
    return s


# ---------------------------------------------------------------- numbers
_FRAC = re.compile(
    r"(-?)\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}|(-?)\\[dt]?frac\s*(\d)\s*(\d)"
)
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|-?\.\d+")


def _clean_numeric(s: str) -> str:
    s = _strip_text_cmds(s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.replace("−", "-").replace("–", "-").replace("\\!", "").replace("{,}", ",")
    s = _drop_spacing(s, " ")
    if "=" in s:  # `x = 3`, `5 \times 3 = 15`: the value is on the right of the last `=`
        s = s.rsplit("=", 1)[1]
    return s


def _find_number(s: str, last: bool = False) -> str | None:
    """The first (or last) number-like token in `s`: a LaTeX fraction, `a/b`, or a decimal with commas."""
    s = _clean_numeric(s)
    hits: list[tuple[int, str]] = []
    for m in _FRAC.finditer(s):
        if m.group(2) is not None:
            hits.append((m.start(), f"{m.group(1)}{m.group(2)}/{m.group(3)}"))
        else:
            hits.append((m.start(), f"{m.group(4)}{m.group(5)}/{m.group(6)}"))
        if not last:
            break
    spans = [(m.start(), m.end()) for m in _FRAC.finditer(s)] if hits else []
    for m in _NUMBER.finditer(s):
        if any(a <= m.start() < b for a, b in spans):
            continue  # digits inside a \frac already counted
        hits.append((m.start(), m.group(0)))
        if not last:
            break
    if not hits:
        return None
    hits.sort()
    tok = (hits[-1] if last else hits[0])[1]
    tok = re.sub(r"\s+", "", tok).replace(",", "")
    return tok if len(tok) <= _MAX_NUMBER_CHARS else None


_NUMBER_TOKEN = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:/-?(?:\d+(?:\.\d*)?|\.\d+))?")


def parse_number(s: str | None) -> Fraction | None:
    """Exact value of a number token such as `-1000`, `2.50`, `3/4` (None when it is not one)."""
    if not isinstance(s, str) or len(s) > _MAX_NUMBER_CHARS or not _NUMBER_TOKEN.fullmatch(s):
        return None  # also keeps Decimal's "inf"/"nan" spellings out
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            d = Fraction(Decimal(den))
            return None if d == 0 else Fraction(Decimal(num)) / d
        return Fraction(Decimal(s))
    except (InvalidOperation, ValueError, ZeroDivisionError, OverflowError):
        return None


def format_number(x: Fraction) -> str:
    """Canonical key of a value: an integer as digits, otherwise a plain decimal with 12 significant digits."""
    if x.denominator == 1:
        return str(x.numerator)
    with localcontext() as ctx:
        ctx.prec = _SIG_DIGITS
        d = (Decimal(x.numerator) / Decimal(x.denominator)).normalize()
    out = format(d, "f")
    return "0" if out in ("-0", "") else out


# ---------------------------------------------------------------- letters
# A bare "A" or "I" only counts as a letter when upper-case; "(b)", "b)" and a lone "b" are fine lower-case.
_LETTER = re.compile(
    r"^(?i:option|choice)?\s*(?:\(([A-Za-z])\)|\[([A-Za-z])\]|([A-Z])(?=$|[\s.):,;\]])|([a-z])(?=$|\)))"
)
_LETTER_LINE = re.compile(r"^\s*[*_]*\s*(?:\(([A-Z])\)|([A-Z])(?:[).:]|(?=[*_]*\s*$)))")


def _find_letter(s: str) -> str | None:
    s = _unwrap(_strip_text_cmds(_unwrap(s)))
    m = _LETTER.match(s)
    if not m:
        return None
    return next(g for g in m.groups() if g).upper()


def letter_for_text(s: str, choices: tuple[str, ...] | list[str]) -> str | None:
    """The letter of the one option whose text equals `s` (case and spacing ignored), else None."""
    key = _squash(_unwrap(_strip_text_cmds(s)))
    hits = [i for i, c in enumerate(choices) if _squash(c) == key]
    return chr(65 + hits[0]) if len(hits) == 1 else None


def _squash(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().strip(".").lower()


# ---------------------------------------------------------------- math
_WORDY = re.compile(r"[A-Za-z]{3,}")


def _looks_like_formula(s: str) -> bool:
    """A short line with no plain words left once LaTeX commands and \\text{} are removed."""
    if not s or len(s) > 80 or "\n" in s:
        return False
    bare = re.sub(r"\\[A-Za-z]+", "", _TEXT_CMDS.sub("", s))
    return _WORDY.search(bare) is None and re.search(r"[0-9A-Za-z]", bare) is not None


def _math_from_phrase(s: str) -> str:
    """`$\\frac12$ since ...` -> `\\frac12`; otherwise the phrase up to the end of its first sentence."""
    m = re.search(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", s)
    if m:
        return next(g for g in m.groups() if g is not None)
    return re.split(r"\.\s+(?=[A-Z])", s, maxsplit=1)[0]


def is_option(letter: str, choices: tuple[str, ...] | list[str] | None) -> bool:
    """Whether `letter` names one of the options (A.. for len(choices)); any letter does without `choices`."""
    if not choices:
        return True
    return len(letter) == 1 and 0 <= ord(letter.upper()) - 65 < len(choices)


# ---------------------------------------------------------------- public API
_NOT_AN_OPTION = "\x00not an option"  # internal marker: a definite letter that names no option


def _from_candidate(cand: str, kind: str, choices) -> str | None:
    if kind in ("numeric", "integer"):
        return _find_number(cand)
    if kind == "choice":
        letter = _find_letter(cand)
        if letter is None and choices:
            letter = letter_for_text(cand, choices)
        if letter is not None and not is_option(letter, choices):
            return _NOT_AN_OPTION
        return letter
    out = _unwrap(cand)
    return out or None


def _extract(text: str, kind: str, choices, marked_only: bool = False) -> str | None:
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(KINDS)}")
    if not isinstance(text, str) or not text.strip():
        return None
    text = drop_format_example(text, kind)
    for box in reversed(_boxed_contents(text)):
        ans = _from_candidate(box, kind, choices)
        if ans is not None:
            return ans
    phrase = _phrase_answer(text)
    if phrase is not None:
        cand = _math_from_phrase(phrase) if kind == "math" else phrase
        ans = _from_candidate(cand, kind, choices)
        if ans is not None:
            return ans
    if marked_only:
        return None
    # Fallbacks when the model gave no marked answer.
    if kind in ("numeric", "integer"):
        return _find_number(text[-2000:], last=True)  # the usual GSM8K "last number" rule
    line = _last_line(text)
    if kind == "choice":
        m = _LETTER_LINE.match(line)
        if m:
            letter = m.group(1) or m.group(2)
            return letter if is_option(letter, choices) else None
        return letter_for_text(line, choices) if choices else None
    line = _unwrap(line)
    return line if _looks_like_formula(line) else None


def extract_answer(text: str, kind: AnswerKind, choices: tuple[str, ...] | None = None,
                   marked_only: bool = False) -> str | None:
    """The final answer in a model's output, or None. Never raises on any text (an unknown kind does raise).

    ``marked_only``: only a `\\boxed{}` or an answer phrase counts, no last-number / last-line fallback (used
    for completions cut at the token limit, whose last number is a fragment of unfinished reasoning).

    numeric/integer: a number token (`1000`, `-2.5`, `3/4`); choice: an upper-case letter (with `choices`, it
    must be one of the options, and an answer given as the option's text maps to its letter); math: the LaTeX
    answer string. The format instruction's example phrase ("for example \\boxed{B}") is never an answer.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(KINDS)}")
    try:
        ans = _extract(text, kind, choices, marked_only)
        return None if ans == _NOT_AN_OPTION else ans
    except RecursionError:  # pragma: no cover - nothing here recurses; belt and braces for the contract
        return None


_MATH_SUBS = (
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    (re.compile(r"\\frac\s*(\d)\s*(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°"), ""),
    (re.compile(r"\\(?:mathrm|textbf|mbox|text)\s*\{"), r"\\text{"),
    (re.compile(r"\s+"), ""),
)


def _normalize_math(s: str) -> str | None:
    s = _unwrap(s)
    s = _drop_spacing(s, "")
    for pat, rep in _MATH_SUBS:
        s = pat.sub(rep, s)
    if re.fullmatch(r"[a-zA-Z]=[^=<>]+", s):  # `x=3` -> `3`; the variable name is not part of the answer
        s = s[2:]
    if re.fullmatch(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?", s):  # a plain number: `1,000.0` -> `1000`
        value = parse_number(s.replace(",", ""))
        if value is not None:
            return format_number(value)
    return s.rstrip(".") or None


def normalize_answer(answer: str | None, kind: AnswerKind) -> str | None:
    """Canonical key of an answer for voting and grading; None for no answer. Never raises on any string.

    numeric/integer: the value (`1,000` -> `1000`, `$5.00` -> `5`, `1/2` -> `0.5`), or when there is no number the
    answer with whitespace removed and lower-cased; choice: the upper-case letter (None without one);
    math: light LaTeX normalisation (`\\dfrac` -> `\\frac`, `\\left`/`\\right` and spaces removed, `x=3` -> `3`).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(KINDS)}")
    if not isinstance(answer, str) or not answer.strip():
        return None
    if kind in ("numeric", "integer"):
        value = parse_number(_find_number(answer))
        if value is not None:
            return format_number(value)
        return re.sub(r"\s+", "", answer).lower()[:200] or None
    if kind == "choice":
        return _find_letter(answer)
    return _normalize_math(answer)
