"""CachedBackend: SQLite persistence, zero inner calls on a repeated run, only successes stored."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from collections.abc import Sequence

import pytest

from dear.llm import Backend, CachedBackend, ChatMessage, ChatRequest, Completion, make_backend


class CountingBackend(Backend):
    """Test double: echoes a counter; `fail` marks prompts that come back as errors."""

    model_id = "counting"

    def __init__(self, fail: str | None = None):
        self.calls: list[int] = []  # batch sizes
        self.n = 0
        self.fail = fail

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        self.calls.append(len(requests))
        out = []
        for r in requests:
            self.n += 1
            if self.fail and self.fail in r.messages[-1].content:
                out.append(Completion("", 0, 0, "error", 0.1, error="injected"))
            else:
                out.append(Completion(f"answer {self.n}", 5, 2, "stop", 0.1))
        return out


def req(text, **kw):
    return ChatRequest((ChatMessage("user", text),), **kw)


def test_second_run_is_all_hits_and_persistent(tmp_path):
    path = tmp_path / "cache.sqlite"
    batch = [req("a", seed=1), req("b", seed=2, temperature=0.2), req("c")]
    inner = CountingBackend()
    first = CachedBackend(inner, path).generate(batch)
    assert inner.calls == [3] and not any(c.cached for c in first)

    again = CountingBackend()
    cached = CachedBackend(again, path)  # a new instance (a new process, later) on the same file
    second = cached.generate(batch)
    assert again.calls == []
    assert [c.text for c in second] == [c.text for c in first] and all(c.cached for c in second)
    assert (cached.hits, cached.misses) == (3, 0)


def test_only_misses_go_to_inner_in_one_call(tmp_path):
    inner = CountingBackend()
    cached = CachedBackend(inner, tmp_path / "c.sqlite")
    cached.generate([req("a"), req("b")])
    out = cached.generate([req("x"), req("a"), req("y"), req("b")])
    assert inner.calls == [2, 2]
    assert [c.cached for c in out] == [False, True, False, True]
    assert (cached.hits, cached.misses) == (2, 4)


def test_key_covers_sampling_but_not_metadata(tmp_path):
    inner = CountingBackend()
    cached = CachedBackend(inner, tmp_path / "c.sqlite")
    cached.generate([req("a", seed=1)])
    variants = [
        req("a", seed=2),
        req("a", seed=1, temperature=0.1),
        req("a", seed=1, top_p=0.5),
        req("a", seed=1, max_tokens=7),
        req("a", seed=1, stop=("\n",)),
        ChatRequest((ChatMessage("system", "a"),), seed=1),
    ]
    assert not any(c.cached for c in cached.generate(variants))
    (same,) = cached.generate([ChatRequest((ChatMessage("user", "a"),), seed=1, metadata={"agent": 2})])
    assert same.cached


def test_identical_requests_in_a_batch_keep_distinct_answers(tmp_path):
    """Three agents, same prompt, no seed: the rerun must not collapse them onto one cached answer."""
    path = tmp_path / "c.sqlite"
    first = CachedBackend(CountingBackend(), path).generate([req("q")] * 3)
    second = CachedBackend(CountingBackend(), path).generate([req("q")] * 3)
    assert len({c.text for c in first}) == 3
    assert [c.text for c in second] == [c.text for c in first]


def test_errors_are_not_stored(tmp_path):
    path = tmp_path / "c.sqlite"
    inner = CountingBackend(fail="bad")
    out = CachedBackend(inner, path).generate([req("bad one"), req("good")])
    assert not out[0].ok and out[1].ok
    inner2 = CountingBackend()
    out2 = CachedBackend(inner2, path).generate([req("bad one"), req("good")])
    assert inner2.calls == [1] and out2[0].ok and not out2[0].cached and out2[1].cached


def test_disabled_passes_through(tmp_path):
    inner = CountingBackend()
    cached = CachedBackend(inner, tmp_path / "c.sqlite", enabled=False)
    cached.generate([req("a")])
    cached.generate([req("a")])
    assert inner.calls == [1, 1] and not (tmp_path / "c.sqlite").exists()


def test_wal_mode(tmp_path):
    CachedBackend(CountingBackend(), tmp_path / "c.sqlite").generate([req("a")])
    mode = sqlite3.connect(tmp_path / "c.sqlite").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def _writer(path, tag):
    cached = CachedBackend(CountingBackend(), path)
    for i in range(30):
        cached.generate([req(f"{tag}-{i}-{j}") for j in range(5)])
    cached.close()


def test_several_processes_share_one_file(tmp_path):
    path = tmp_path / "shared.sqlite"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, t)) for t in ("p", "q", "r")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    rows = sqlite3.connect(path).execute("SELECT COUNT(*) FROM completions").fetchone()[0]
    assert rows == 3 * 30 * 5


def test_real_smoke_model_second_run_makes_no_backend_call(tmp_path):
    pytest.importorskip("xllamacpp")
    smoke = make_backend("smoke", n_parallel=2, n_ctx=512, n_threads=1)
    calls = []
    real_generate = smoke.generate
    smoke.generate = lambda rs: calls.append(len(rs)) or real_generate(rs)  # count calls, keep real behaviour
    batch = [
        req("Say hi.", temperature=0.0, max_tokens=4),
        req("Say bye.", temperature=0.7, seed=5, max_tokens=4),
    ]
    path = tmp_path / "smoke.sqlite"
    try:
        first = CachedBackend(smoke, path).generate(batch)
        second_cache = CachedBackend(smoke, path)
        second = second_cache.generate(batch)
    finally:
        smoke.close()
    assert calls == [2]
    assert all(c.ok for c in first) and all(c.cached for c in second)
    assert [(c.text, c.prompt_tokens, c.completion_tokens) for c in second] == [
        (c.text, c.prompt_tokens, c.completion_tokens) for c in first
    ]
    assert second_cache.model_id == "smoke:smollm2-135m-instruct-q4_1"


def test_damaged_cache_file_is_named(tmp_path):
    from dear.llm import BackendError

    bad = tmp_path / "c.sqlite"
    bad.write_bytes(b"this is not an sqlite database, just damaged bytes" * 100)
    with pytest.raises(BackendError, match=r"c\.sqlite: cannot be used as an SQLite cache"):
        CachedBackend(CountingBackend(), bad)
    with pytest.raises(BackendError, match="is a directory"):
        CachedBackend(CountingBackend(), tmp_path)
    path = tmp_path / "ok.sqlite"
    cached = CachedBackend(CountingBackend(), path)
    cached.generate([req("a", seed=1)])
    cached.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE completions SET completion = '{\"text\": trunc'")
    db.commit()
    db.close()
    inner = CountingBackend()
    (c,) = CachedBackend(inner, path).generate([req("a", seed=1)])  # a damaged entry is asked again
    assert c.ok and not c.cached and inner.calls == [1]


def test_occurrence_keys_number_identical_requests_within_a_batch_or_across_calls():
    from dear.llm.cache import cache_key, occurrence_keys

    a, b = req("a", seed=1), req("b", seed=1)
    first = cache_key("m", a)
    assert occurrence_keys("m", [a, b, a]) == [first, cache_key("m", b), cache_key("m", a, 1)]
    assert occurrence_keys("m", [a]) == [first]  # without `seen`, each batch counts from 0
    seen: dict[str, int] = {}
    assert occurrence_keys("m", [a], seen) + occurrence_keys("m", [a], seen) == [first, cache_key("m", a, 1)]
    assert len(set(occurrence_keys("m", [a, a, a]))) == 3 and occurrence_keys("other", [a]) != [first]
