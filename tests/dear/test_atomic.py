"""dear/atomic.py: a write that fails leaves the old file and no temporary file; the bytes are json.dumps'."""

import json
import os

import pytest

import dear.atomic
import dear.integrity
from dear.atomic import atomic_write_text, write_json

OLD = '{\n "old": true\n}'


def _leftovers(directory):
    return [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_write_json_keeps_the_formatting_it_is_given(tmp_path):
    obj = {"b": [1, 2.5, float("nan")], "a": "é", "c": {"x": None}}
    for kwargs, newline in [({"indent": 1}, False), ({"indent": 2, "default": float}, False),
                            ({"indent": 2}, True), ({"indent": 2, "sort_keys": True, "ensure_ascii": False}, True)]:
        path = tmp_path / "run.json"
        write_json(path, obj, trailing_newline=newline, **kwargs)
        assert path.read_bytes() == (json.dumps(obj, **kwargs) + ("\n" if newline else "")).encode("utf-8")
    assert _leftovers(tmp_path) == []


def test_a_write_interrupted_midway_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text(OLD)

    def crash(fd):  # the new bytes are in the temporary file, not yet renamed over the old one
        raise OSError("disk gone")

    monkeypatch.setattr(dear.atomic.os, "fsync", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_json(path, {"new": list(range(1000))}, indent=1)
    assert path.read_text() == OLD
    assert _leftovers(tmp_path) == []


def test_an_object_that_cannot_be_serialised_leaves_the_old_file(tmp_path):
    path = tmp_path / "timings.json"
    path.write_text(OLD)
    with pytest.raises(TypeError):
        write_json(path, {"first": 1, "new": object()}, indent=1)
    assert path.read_text() == OLD
    assert _leftovers(tmp_path) == []


def test_a_successful_write_replaces_the_file_with_the_usual_permissions(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(OLD)
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not a private temporary file's 0600
    write_json(path, {"n": 1})
    assert path.read_text() == '{"n": 1}' and _leftovers(tmp_path) == []


def test_integrity_reexports_the_one_writer():
    assert dear.integrity.atomic_write_text is dear.atomic.atomic_write_text
    assert dear.integrity.atomic_write_bytes is dear.atomic.atomic_write_bytes
