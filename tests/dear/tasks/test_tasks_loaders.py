"""Loaders: record counts against PROVENANCE.md, option shuffling, subsets, the registry and the JSONL loader."""

from __future__ import annotations

import collections
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dear.tasks import TASKS, Question, load, load_jsonl, task_names
from dear.tasks.loaders import data_file, subset
from tests import ROOT

# (task, split, data folder, count as written in that folder's PROVENANCE.md)
COUNTS = [
    ("gsm8k", "train", "gsm8k", 7473),
    ("gsm8k", "test", "gsm8k", 1319),
    ("gsm_hard", "test", "gsm_hard", 1319),
    ("math500", "test", "math500", 500),
    ("aime24", "test", "aime24", 30),
    ("gpqa_diamond", "test", "gpqa", 198),
    ("arc_challenge", "test", "arc_challenge", 1172),
    ("truthfulqa_mc1", "test", "truthfulqa", 817),
    ("mmlu_pro_health", "test", "mmlu_pro_health", 818),
    ("commonsenseqa", "dev", "commonsenseqa", 1221),
]


def _provenance(folder: str) -> str:
    return data_file(folder, "PROVENANCE.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("task,split,folder,count", COUNTS)
def test_counts_match_provenance(task, split, folder, count):
    # The count is the one PROVENANCE.md states (with or without a thousands separator).
    text = _provenance(folder)
    assert re.search(rf"\b({count}|{count:,})\b", text), f"{count} not stated in {folder}/PROVENANCE.md"
    qs = load(task, split)
    assert len(qs) == count
    assert len({q.id for q in qs}) == count, "ids must be unique"
    spec = TASKS[task]
    for q in qs:
        assert isinstance(q, Question) and q.task == task and q.kind == spec.kind
        assert q.question.strip() and q.gold.strip()
        if q.kind == "choice":
            assert q.choices and all(c.strip() for c in q.choices)
            assert "A" <= q.gold < chr(65 + len(q.choices))
        else:
            assert q.choices is None


def test_every_registered_set_is_covered_and_defaults():
    assert set(task_names()) == {t for t, *_ in COUNTS} | {"synthetic"}
    assert len(load("gsm8k")) == 1319  # default split is test
    assert len(load("commonsenseqa")) == 1221


def test_gold_answers_are_parsed_from_the_sources():
    gsm = load("gsm8k", "test")
    assert gsm[0].question.startswith("Janet") and gsm[0].gold == "18"
    train_golds = [q.gold for q in load("gsm8k", "train")]
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", g) for g in train_golds)  # `#### 1,080` lost its comma
    hard = load("gsm_hard")
    assert hard[0].gold == "-9867630" and "code" not in hard[0].question
    assert hard[7].gold == "3244047.1"  # source float 3244047.0999999996
    assert sum(q.gold.startswith("-") for q in hard) == 146  # PROVENANCE: 146 negative targets
    math = load("math500")
    assert math[0].gold == r"\left( 3, \frac{\pi}{2} \right)" and math[0].id == "test/precalculus/807.json"
    aime = load("aime24")
    assert aime[0].gold == "204" and "025" in [q.gold for q in aime]  # kept as written; graded numerically
    mmlu = load("mmlu_pro_health")
    assert mmlu[0].id == "6001" and mmlu[0].gold == "E" and len(mmlu[0].choices) == 7
    assert max(len(q.choices) for q in mmlu) == 10
    arc = load("arc_challenge")
    assert arc[0].id == "Mercury_7175875" and arc[0].gold == "C"
    assert collections.Counter(len(q.choices) for q in arc) == {4: 1165, 3: 4, 5: 3}
    assert collections.Counter(q.gold for q in arc) == {"A": 266, "B": 311, "C": 310, "D": 285}


def test_gpqa_is_decrypted_in_memory_and_options_shuffled_deterministically():
    qs = load("gpqa_diamond")
    raw = zipfile.ZipFile(io.BytesIO(data_file("gpqa", "dataset.zip").read_bytes())).read(
        "dataset/gpqa_diamond.csv", pwd=b"deserted-untie-orchid"
    )
    rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8"))))
    assert len(rows) == len(qs) == 198
    for q, row in zip(qs, rows):
        assert q.id == row["Record ID"].strip()
        correct = q.choices[ord(q.gold) - 65]
        assert correct == row["Correct Answer"].strip()
        assert sorted(q.choices) == sorted(
            [row["Correct Answer"].strip()] + [row[f"Incorrect Answer {k}"].strip() for k in (1, 2, 3)]
        )
    letters = collections.Counter(q.gold for q in qs)
    assert set(letters) == {"A", "B", "C", "D"} and max(letters.values()) < 80  # not "always A"
    # Deterministic across processes (str seeds are hashed with sha512, not PYTHONHASHSEED).
    code = "from dear.tasks import load; print(''.join(q.gold for q in load('gpqa_diamond')))"
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "".join(q.gold for q in qs)
    assert not list(Path(data_file("gpqa")).glob("*.csv")), "decrypted CSV must never be written"


def test_truthfulqa_mc1_shuffled_with_one_true_option():
    qs = load("truthfulqa_mc1")
    records = json.loads(data_file("truthfulqa", "mc_task.json").read_text(encoding="utf-8"))
    for q, rec in zip(qs, records):
        true = next(t for t, v in rec["mc1_targets"].items() if v == 1)
        assert q.choices[ord(q.gold) - 65] == true.strip()
        assert len(q.choices) == len(rec["mc1_targets"])
    assert collections.Counter(q.gold for q in qs)["A"] < 300  # the source always has the true option first


def test_subset_is_seeded_stable_and_prefix_consistent():
    a = load("gsm8k", "test", n=50, seed=3)
    b = load("gsm8k", "test", n=50, seed=3)
    assert [q.id for q in a] == [q.id for q in b]
    assert [q.id for q in load("gsm8k", "test", n=20, seed=3)] == [q.id for q in a[:20]]
    assert [q.id for q in load("gsm8k", "test", n=50, seed=4)] != [q.id for q in a]
    assert len({q.id for q in a}) == 50
    assert [q.id for q in a] != [q.id for q in load("gsm8k", "test")[:50]]  # actually shuffled
    everything = load("aime24", n=1000, seed=1)
    assert len(everything) == 30 and {q.id for q in everything} == {q.id for q in load("aime24")}
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="n must be"):
            subset(load("aime24"), bad)


def test_unknown_task_and_split_errors_name_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'gsm9k'.*gsm8k.*math500.*synthetic"):
        load("gsm9k")
    with pytest.raises(ValueError, match="no split 'validation'.*train, test"):
        load("gsm8k", "validation")


def test_synthetic_is_registered_lazily():
    qs = load("synthetic", n=5, seed=1)
    assert len(qs) == 5 and all(isinstance(q, Question) and q.task == "synthetic" for q in qs)
    assert [q.id for q in qs] == [q.id for q in load("synthetic", n=5, seed=1)]


# ---------------------------------------------------------------- generic JSONL loader
def _write(tmp_path: Path, lines: list[str], name: str = "mine.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_load_jsonl_numeric_math_and_choice_layouts(tmp_path):
    p = _write(
        tmp_path, [json.dumps({"q": "1+1?", "a": 2, "uid": 7}), "", json.dumps({"q": "2+2?", "a": "4"})]
    )
    qs = load_jsonl(p, "q", "a", "numeric", name="adds")
    assert [(q.id, q.task, q.gold) for q in qs] == [("1", "adds", "2"), ("3", "adds", "4")]

    rows = [
        {"item": {"stem": "Sky?"}, "opts": ["red", "blue"], "key": "B", "id": "x1"},
        {
            "item": {"stem": "Grass?"},
            "opts": {"text": ["green", "pink"], "label": ["1", "2"]},
            "key": "1",
            "id": "x2",
        },
        {"item": {"stem": "Sun?"}, "opts": ["cold", "hot", "wet"], "key": 1, "id": "x3"},
        {"item": {"stem": "Snow?"}, "opts": {"A": "white", "B": "black"}, "key": "white", "id": "x4"},
    ]
    p = _write(tmp_path, [json.dumps(r) for r in rows])
    qs = load_jsonl(p, "item.stem", "key", "choice", choices_field="opts", id_field="id")
    assert [(q.id, q.gold, q.choices) for q in qs] == [
        ("x1", "B", ("red", "blue")),
        ("x2", "A", ("green", "pink")),
        ("x3", "B", ("cold", "hot", "wet")),
        ("x4", "A", ("white", "black")),
    ]
    assert qs[0].task == "mine"


def test_load_jsonl_malformed_line_names_file_and_line(tmp_path):
    p = _write(tmp_path, [json.dumps({"q": "a", "a": 1}), '{"q": "b", "a": ', json.dumps({"q": "c", "a": 3})])
    with pytest.raises(ValueError, match=rf"{re.escape(str(p))}:2: malformed JSON"):
        load_jsonl(p, "q", "a", "numeric")
    p = _write(tmp_path, [json.dumps({"q": "a", "a": 1}), "[1, 2]"], "list.jsonl")
    with pytest.raises(ValueError, match=r"list.jsonl:2: expected a JSON object"):
        load_jsonl(p, "q", "a", "numeric")


def test_load_jsonl_missing_or_bad_fields_are_named(tmp_path):
    p = _write(tmp_path, [json.dumps({"q": "a", "a": 1}), json.dumps({"question": "b", "a": 2})])
    with pytest.raises(ValueError, match=r"mine.jsonl:2: missing field 'q'"):
        load_jsonl(p, "q", "a", "numeric")
    p = _write(tmp_path, [json.dumps({"q": "a", "a": None})])
    with pytest.raises(ValueError, match=r":1: field 'a' must be a non-empty string or number"):
        load_jsonl(p, "q", "a", "math")
    p = _write(tmp_path, [json.dumps({"q": "a", "a": "C", "c": ["x", "y"]})])
    with pytest.raises(ValueError, match=r":1: field 'a' = 'C' is not one of the labels"):
        load_jsonl(p, "q", "a", "choice", choices_field="c")
    p = _write(tmp_path, [json.dumps({"q": "a", "a": "A", "c": "x or y"})])
    with pytest.raises(ValueError, match=r":1: field 'c' must be a list"):
        load_jsonl(p, "q", "a", "choice", choices_field="c")
    with pytest.raises(ValueError, match="choices_field"):
        load_jsonl(p, "q", "a", "choice")
    with pytest.raises(ValueError, match="unknown answer kind 'text'"):
        load_jsonl(p, "q", "a", "text")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_jsonl(tmp_path / "nope.jsonl", "q", "a", "numeric")
    p = _write(tmp_path, ["", "  "], "empty.jsonl")
    with pytest.raises(ValueError, match="empty.jsonl: no records"):
        load_jsonl(p, "q", "a", "numeric")
    p = tmp_path / "bin.jsonl"
    p.write_bytes(b'{"q": "\xff"}\n')
    with pytest.raises(ValueError, match="bin.jsonl: not UTF-8"):
        load_jsonl(p, "q", "a", "numeric")


def test_installed_wheel_finds_its_data(tmp_path):
    """Build the wheel, unpack it outside the repo and load from there (what a non-editable install sees)."""
    repo = ROOT
    wheel_dir, site, src = tmp_path / "wheel", tmp_path / "site", tmp_path / "src"
    # Build from a copy so setuptools' build/ and egg-info never land in the working tree.
    shutil.copytree(repo / "dear", src / "dear", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(repo / "pyproject.toml", src / "pyproject.toml")
    (src / "README.md").write_text("DEAR\n")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(src),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    if build.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {build.stderr[-300:]}")
    (wheel,) = wheel_dir.glob("dear-*.whl")
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import os, dear.tasks; from dear.tasks import load; "
        "assert dear.tasks.__file__.startswith(os.environ['SITE']), dear.tasks.__file__; "
        "print(len(load('math500')), len(load('gpqa_diamond')), len(load('gsm8k', 'train')))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = env["SITE"] = str(site)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["500", "198", "7473"]
