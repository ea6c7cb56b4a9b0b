"""Bundled benchmark loaders, the task registry, and a generic JSONL loader for user data.

Data lives in `dear/tasks/data/<set>/` as package data (each folder has a PROVENANCE.md) and is read through
`importlib.resources`, so an installed (non-editable) package finds it. `load(name, split, n, seed)` returns the
split in source order, or with `n` a seeded-shuffle subset: the same (name, split, n, seed) always gives the same
questions in the same order, and a smaller n is a prefix of a larger one, so every method sees the same items.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import os
import random
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from dear.tasks.extract import KINDS, format_number

try:  # Python >= 3.11; importlib.abc.Traversable is deprecated from 3.12
    from importlib.resources.abc import Traversable
except ImportError:  # pragma: no cover - Python 3.10
    from importlib.abc import Traversable
from dear.tasks.types import AnswerKind, Question

PathLike = str | os.PathLike | Traversable

# Options of GPQA and TruthfulQA MC1 are stored with the correct one first; we shuffle them per question from
# this seed (and the question's id), independent of the subset seed, so a question always has the same letters.
OPTION_SEED = 0
_GPQA_PASSWORD = b"deserted-untie-orchid"  # published in the GPQA README; the zip only keeps crawlers out


def data_file(*parts: str) -> Traversable:
    """A bundled data file, e.g. `data_file("gsm8k", "test.jsonl")`."""
    return resources.files("dear.tasks").joinpath("data", *parts)


# ---------------------------------------------------------------- JSONL reading with precise errors
def _label(path: PathLike) -> str:
    return os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)


def _read_text(path: PathLike) -> str:
    try:
        if isinstance(path, (str, os.PathLike)):
            return Path(path).read_text(encoding="utf-8")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"data file not found: {_label(path)}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{_label(path)}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_jsonl(path: PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a bad line raises ValueError naming file and line."""
    label = _label(path)
    for lineno, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{label}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{label}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def _get(rec: dict[str, Any], field: str, where: str) -> Any:
    """rec[field]; dotted names reach into nested objects (`question.stem`)."""
    cur: Any = rec
    for part in field.split("."):
        if not isinstance(cur, dict) or part not in cur:
            keys = ", ".join(sorted(rec)) if isinstance(rec, dict) else ""
            raise ValueError(f"{where}: missing field {field!r} (record has: {keys})")
        cur = cur[part]
    return cur


def _choices(raw: Any, field: str, where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(option texts, labels) from a list of texts, {"text": [...], "label": [...]}, or {label: text}."""
    if isinstance(raw, list):
        texts, labels = raw, [chr(65 + i) for i in range(len(raw))]
    elif isinstance(raw, dict) and "text" in raw:
        texts = raw["text"]
        labels = raw.get("label") or [chr(65 + i) for i in range(len(texts))]
    elif isinstance(raw, dict):
        labels, texts = list(raw), list(raw.values())
    else:
        raise ValueError(
            f"{where}: field {field!r} must be a list of options or a dict, got {type(raw).__name__}"
        )
    if not isinstance(texts, list) or len(texts) != len(labels) or not 2 <= len(texts) <= 26:
        raise ValueError(f"{where}: field {field!r} needs 2-26 options with one label each")
    if not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{where}: field {field!r} has a non-string option")
    return tuple(t.strip() for t in texts), tuple(str(lb).strip() for lb in labels)


def _choice_gold(answer: Any, texts: Sequence[str], labels: Sequence[str], field: str, where: str) -> str:
    """The correct letter from a label (`"B"`, `"2"`), a 0-based index, or the option text itself."""
    if isinstance(answer, bool):
        raise ValueError(f"{where}: field {field!r} is a boolean, expected a label, index or option text")
    if isinstance(answer, int):
        if 0 <= answer < len(texts):
            return chr(65 + answer)
    elif isinstance(answer, str):
        a = answer.strip()
        if a in labels:
            return chr(65 + labels.index(a))
        if a.upper() in [lb.upper() for lb in labels]:
            return chr(65 + [lb.upper() for lb in labels].index(a.upper()))
        if a in texts:
            return chr(65 + list(texts).index(a))
    raise ValueError(
        f"{where}: field {field!r} = {answer!r} is not one of the labels {list(labels)} or options"
    )


def load_jsonl(
    path: PathLike,
    question_field: str,
    answer_field: str | None,
    kind: AnswerKind,
    choices_field: str | None = None,
    id_field: str | None = None,
    name: str | None = None,
) -> list[Question]:
    """Questions from a user JSONL file, one object per line (dotted field names reach nested objects).

    For `choice`, `choices_field` holds a list of option texts, `{"text": [...], "label": [...]}` or
    `{label: text}`, and `answer_field` a label, a 0-based index or the correct option's text. Ids default to
    `<line number>`. Errors name the file, the line and the field. `answer_field=None` loads questions without
    gold answers (gold ""; inference only: nothing can be graded).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(KINDS)}")
    if kind == "choice" and not choices_field:
        raise ValueError("kind 'choice' needs choices_field (the field with the options)")
    label = _label(path)
    task = name or Path(label).stem
    out: list[Question] = []
    for lineno, rec in read_jsonl(path):
        where = f"{label}:{lineno}"
        text = _get(rec, question_field, where)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: field {question_field!r} must be a non-empty string")
        answer = _get(rec, answer_field, where) if answer_field else None
        qid = str(_get(rec, id_field, where)) if id_field else str(lineno)
        choices = None
        if kind == "choice":
            assert choices_field is not None
            choices, labels = _choices(_get(rec, choices_field, where), choices_field, where)
            gold = _choice_gold(answer, choices, labels, answer_field, where) if answer_field else ""
        elif not answer_field:
            gold = ""
        elif isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
            raise ValueError(f"{where}: field {answer_field!r} must be a non-empty string or number")
        else:
            gold = str(answer).strip()
        out.append(Question(id=qid, task=task, question=text.strip(), gold=gold, kind=kind, choices=choices))
    if not out:
        raise ValueError(f"{label}: no records")
    return out


# ---------------------------------------------------------------- bundled sets
def _shuffled_options(correct: str, wrong: Sequence[str], key: str) -> tuple[tuple[str, ...], str]:
    options = [correct, *wrong]
    order = list(range(len(options)))
    random.Random(f"{OPTION_SEED}:{key}").shuffle(order)  # str seeds hash with sha512: stable across runs
    return tuple(options[i] for i in order), chr(65 + order.index(0))


def _gsm8k(split: str) -> list[Question]:
    path = data_file("gsm8k", f"{split}.jsonl")
    out = []
    for lineno, rec in read_jsonl(path):
        where = f"{_label(path)}:{lineno}"
        solution = _get(rec, "answer", where)
        if "####" not in solution:
            raise ValueError(f"{where}: field 'answer' has no '#### <number>' line")
        gold = solution.rsplit("####", 1)[1].strip().replace(",", "")
        text = _get(rec, "question", where).strip()
        out.append(
            Question(id=f"{split}-{lineno - 1}", task="gsm8k", question=text, gold=gold, kind="numeric")
        )
    return out


def _gsm_hard(split: str) -> list[Question]:
    path = data_file("gsm_hard", "gsmhardv2.jsonl")
    out = []
    for lineno, rec in read_jsonl(path):
        where = f"{_label(path)}:{lineno}"
        target = _get(rec, "target", where)
        # Targets are floats with binary noise (3244047.0999999996); keep 12 significant digits.
        gold = format_number(Fraction(Decimal(repr(float(target)))))
        text = _get(rec, "input", where).strip()  # never the `code` field: it holds the solution
        out.append(
            Question(id=f"{split}-{lineno - 1}", task="gsm_hard", question=text, gold=gold, kind="numeric")
        )
    return out


def _gpqa_diamond(split: str) -> list[Question]:
    blob = data_file("gpqa", "dataset.zip").read_bytes()
    member = "dataset/gpqa_diamond.csv"
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:  # decrypted in memory only; never written to disk
        raw = zf.read(member, pwd=_GPQA_PASSWORD).decode("utf-8")
    out = []
    for row_no, row in enumerate(csv.DictReader(io.StringIO(raw)), start=1):
        where = f"gpqa/dataset.zip:{member} row {row_no}"
        rid = _get(row, "Record ID", where).strip()
        correct = _get(row, "Correct Answer", where).strip()
        wrong = [_get(row, f"Incorrect Answer {k}", where).strip() for k in (1, 2, 3)]
        choices, gold = _shuffled_options(correct, wrong, f"gpqa:{rid}")
        text = _get(row, "Question", where).strip()
        out.append(
            Question(id=rid, task="gpqa_diamond", question=text, gold=gold, kind="choice", choices=choices)
        )
    return out


def _truthfulqa_mc1(split: str) -> list[Question]:
    path = data_file("truthfulqa", "mc_task.json")
    records = json.loads(_read_text(path))
    out = []
    for i, rec in enumerate(records):
        where = f"{_label(path)} record {i}"
        targets: dict[str, int] = _get(rec, "mc1_targets", where)
        correct = [t for t, v in targets.items() if v == 1]
        if len(correct) != 1:
            raise ValueError(
                f"{where}: field 'mc1_targets' must mark exactly one option 1, got {len(correct)}"
            )
        wrong = [t for t, v in targets.items() if v != 1]
        choices, gold = _shuffled_options(correct[0], wrong, f"truthfulqa_mc1:{i}")
        text = _get(rec, "question", where).strip()
        out.append(
            Question(
                id=f"mc1-{i}", task="truthfulqa_mc1", question=text, gold=gold, kind="choice", choices=choices
            )
        )
    return out


def _jsonl_set(task: str, folder: str, filename: str, **fields: Any) -> Callable[[str], list[Question]]:
    def load_split(split: str) -> list[Question]:
        return load_jsonl(data_file(folder, filename.format(split=split)), name=task, **fields)

    return load_split


# ---------------------------------------------------------------- registry
@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: AnswerKind | None  # None: set per question (synthetic)
    splits: tuple[str, ...]  # empty: the generator validates the split itself
    default_split: str | None
    description: str
    load_split: Callable[[str], list[Question]] | None = None  # full split in source order
    generate: Callable[..., list[Question]] | None = None  # (n, seed, split) for generated tasks


def _load_synthetic(n: int | None, seed: int, split: str | None) -> list[Question]:
    try:
        module = importlib.import_module("dear.tasks.synthetic")
    except ModuleNotFoundError as e:
        if e.name != "dear.tasks.synthetic":
            raise
        raise ImportError("task 'synthetic' needs dear/tasks/synthetic.py, which is not present") from None
    kwargs: dict[str, Any] = {"n": n, "seed": seed}
    if split is not None:
        kwargs["split"] = split
    return module.load_synthetic(**kwargs)


TASKS: dict[str, TaskSpec] = {
    s.name: s
    for s in [
        TaskSpec(
            "gsm8k",
            "numeric",
            ("train", "test"),
            "test",
            "GSM8K grade-school math (train 7,473 / test 1,319)",
            _gsm8k,
        ),
        TaskSpec(
            "gsm_hard",
            "numeric",
            ("test",),
            "test",
            "GSM-Hard: GSM8K test with large numbers (1,319)",
            _gsm_hard,
        ),
        TaskSpec(
            "math500",
            "math",
            ("test",),
            "test",
            "MATH-500, PRM800K test split of MATH (500)",
            _jsonl_set(
                "math500",
                "math500",
                "test.jsonl",
                question_field="problem",
                answer_field="answer",
                kind="math",
                id_field="unique_id",
            ),
        ),
        TaskSpec(
            "aime24",
            "integer",
            ("test",),
            "test",
            "AIME 2024 I+II (30)",
            _jsonl_set(
                "aime24",
                "aime24",
                "test.jsonl",
                question_field="problem",
                answer_field="answer",
                kind="integer",
                id_field="id",
            ),
        ),
        TaskSpec(
            "gpqa_diamond",
            "choice",
            ("test",),
            "test",
            "GPQA Diamond, 4 options shuffled per question (198)",
            _gpqa_diamond,
        ),
        TaskSpec(
            "arc_challenge",
            "choice",
            ("test",),
            "test",
            "ARC-Challenge test (1,172)",
            _jsonl_set(
                "arc_challenge",
                "arc_challenge",
                "test.jsonl",
                question_field="question",
                answer_field="answerKey",
                kind="choice",
                choices_field="choices",
                id_field="id",
            ),
        ),
        TaskSpec(
            "truthfulqa_mc1",
            "choice",
            ("test",),
            "test",
            "TruthfulQA MC1, options shuffled per question (817)",
            _truthfulqa_mc1,
        ),
        TaskSpec(
            "mmlu_pro_health",
            "choice",
            ("test",),
            "test",
            "MMLU-Pro health category, up to 10 options (818)",
            _jsonl_set(
                "mmlu_pro_health",
                "mmlu_pro_health",
                "test.jsonl",
                question_field="question",
                answer_field="answer",
                kind="choice",
                choices_field="options",
                id_field="question_id",
            ),
        ),
        TaskSpec(
            "commonsenseqa",
            "choice",
            ("dev",),
            "dev",
            "CommonsenseQA dev split (1,221)",
            _jsonl_set(
                "commonsenseqa",
                "commonsenseqa",
                "dev.jsonl",
                question_field="question",
                answer_field="answerKey",
                kind="choice",
                choices_field="choices",
                id_field="id",
            ),
        ),
        TaskSpec(
            "synthetic",
            None,
            (),
            None,
            "generated questions for the sim backend (dear/tasks/synthetic.py)",
            generate=_load_synthetic,
        ),
    ]
}


# Short names users type for the registered tasks.
TASK_ALIASES: dict[str, str] = {
    "gpqa": "gpqa_diamond",
    "math": "math500",
    "math-500": "math500",
    "gsm-hard": "gsm_hard",
    "arc": "arc_challenge",
    "truthfulqa": "truthfulqa_mc1",
    "csqa": "commonsenseqa",
}


def task_names() -> list[str]:
    return list(TASKS)


def known_tasks_hint() -> str:
    """The registered tasks and their aliases, as error messages list them."""
    aliases = ", ".join(f"{a} = {t}" for a, t in TASK_ALIASES.items())
    return f"known tasks: {', '.join(TASKS)} (aliases: {aliases})"


def canonical_task(name: str) -> str:
    """The registered name of a task or of one of its aliases (TASK_ALIASES)."""
    name = TASK_ALIASES.get(name, name)
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; {known_tasks_hint()}")
    return name


def get_task(name: str) -> TaskSpec:
    return TASKS[canonical_task(name)]


@lru_cache(maxsize=32)
def _load_split_cached(name: str, split: str) -> tuple[Question, ...]:
    spec = TASKS[name]
    assert spec.load_split is not None
    return tuple(spec.load_split(split))


def subset(items: Sequence[Question], n: int | None, seed: int = 0) -> list[Question]:
    """All items in order (n None), or the first n of a seeded shuffle (n larger than the set: all, shuffled)."""
    if n is None:
        return list(items)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer or None, got {n!r}")
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[i] for i in order[:n]]


# A split may be cut in two fixed parts, `SPLIT/fit` and `SPLIT/holdout` (e.g. `train/holdout`): a question is held
# out when the CRC-32 of its id is divisible by HOLDOUT_EVERY (a quarter of any split, the same whatever the order,
# the n or the seed), so that policies and thresholds fitted on `train/fit` are checked on questions they never saw
# without touching the test split.
PARTS = ("fit", "holdout")
HOLDOUT_EVERY = 4


def held_out(question_id: str) -> bool:
    """Whether a question belongs to the `holdout` part of its split."""
    return zlib.crc32(question_id.encode("utf-8")) % HOLDOUT_EVERY == 0


def load(name: str, split: str | None = None, n: int | None = None, seed: int = 0) -> list[Question]:
    """Questions of a registered task (see `task_names()`); `n` takes a seeded-shuffle subset. `split` may name a
    part of a split (`train/fit`, `train/holdout`: `held_out`)."""
    name = canonical_task(name)
    spec = TASKS[name]
    if spec.generate is not None:
        return spec.generate(n, seed, split)
    split = split or spec.default_split
    base, _, part = split.partition("/")
    if base not in spec.splits:
        raise ValueError(f"task {name!r} has no split {base!r}; splits: {', '.join(spec.splits)}")
    if part and part not in PARTS:
        raise ValueError(f"split {split!r}: the part after '/' must be one of {', '.join(PARTS)}")
    items = _load_split_cached(name, base)
    if part:
        items = tuple(q for q in items if held_out(q.id) == (part == "holdout"))
    return subset(items, n, seed)
