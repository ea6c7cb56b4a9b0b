"""Progress that moves while debates run: the live display, the token counter the backends advance, the
training loop's ticks before a chunk ends, the ETA counted in tokens and the debates in flight, the resume line
and the llama.cpp thread rule."""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

import dear.progress
from dear.llm.base import GENERATED_TOKENS, ChatMessage, ChatRequest
from dear.llm.local import choose_threads
from dear.progress import LiveProgress
from train.config import load_config
from train.happo import main
from train.runner import Trainer

TINY = ["logging.progress=false", "rollout.num_workers=0", "rollout.envs_per_worker=4", "rollout.group_size=1", "rollout.episodes_per_iter=4"]


# ------------------------------------------------------------------ the display


def test_non_terminal_display_writes_a_line_per_interval_with_tokens_and_leaves_kept_work_out_of_the_rate():
    tokens = [100]  # a counter that already stood at 100: the display shows only what it generated
    out = io.StringIO()
    snaps = []
    with LiveProgress(8, "HAPPO", tokens=lambda: tokens[0], file=out, listener=snaps.append, refresh_s=0.02,
                      line_every_s=3600) as p:
        p.skip(2)
        tokens[0] += 50
        deadline = time.monotonic() + 5
        while not any(s.tokens == 50 for s in snaps) and time.monotonic() < deadline:
            time.sleep(0.01)
        p.update(2)
        p.set_info(it="1/4")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # the first tick and the close, nothing in between (interval of an hour)
    assert lines[0].startswith("HAPPO:") and "2/8" in lines[0] and "tok=50" in lines[0]
    assert "4/8" in lines[1] and "it=1/4" in lines[1] and "tok/s=" in lines[1]
    assert "\r" not in out.getvalue()
    last = p.snapshot()
    assert last.done == 4 and last.tokens == 50
    assert p.bar.format_dict["initial"] == 2  # the 2 skipped debates are not in the debates/s rate


def test_a_disabled_display_prints_nothing_but_still_ticks_its_listener():
    out = io.StringIO()
    snaps = []
    with LiveProgress(3, "x", tokens=lambda: 7, enabled=False, file=out, listener=snaps.append, refresh_s=0.01):
        time.sleep(0.1)
    assert out.getvalue() == "" and snaps and snaps[-1].total == 3


def test_a_failing_token_counter_keeps_the_last_count():
    calls = iter([0, 5])

    def counter():
        value = next(calls, None)
        if value is None:
            raise TimeoutError("engine busy")
        return value

    p = LiveProgress(1, "x", tokens=counter, enabled=False)
    assert p.snapshot().tokens == 5
    assert p.snapshot().tokens == 5  # the counter failed: the display shows its last answer
    p.close()


def test_bad_totals_are_refused():
    with pytest.raises(ValueError, match="total and initial"):
        LiveProgress(-1, "x")


def test_the_eta_shows_before_any_unit_is_done_counted_in_tokens_with_the_units_in_flight():
    """Issue 59 item 1: with the tokens a unit is expected to take, the ETA appears with the first tokens (not after
    the first finished unit), and once units finished the measured tokens per unit replace the expectation."""
    tokens = [0]
    out = io.StringIO()
    p = LiveProgress(100, "HAPPO", tokens=lambda: tokens[0], file=out, refresh_s=3600, line_every_s=3600,
                     expected_tokens_per_unit=1000)
    p.set_in_flight(2)
    p.tick(line=True)
    assert "<?" in out.getvalue().splitlines()[-1] and "in_flight=2" in out.getvalue()  # no token yet: no ETA
    tokens[0] = 500  # half a unit's work, nothing finished
    time.sleep(0.05)
    p.tick(line=True)
    line = out.getvalue().splitlines()[-1]
    assert "0/100" in line and "<?" not in line and "in_flight=2" in line
    assert p.tokens_per_unit() == 1000
    rate = p.rate()
    assert rate == pytest.approx(0.5 / p.snapshot().elapsed_s, rel=0.2)
    tokens[0] = 4000
    p.update(2)  # 2 units took 4,000 tokens: 2,000 each from now on
    assert p.tokens_per_unit() == 2000
    p.skip(3)  # kept from an interrupted run: not in the measurement
    assert p.tokens_per_unit() == 2000
    p.set_in_flight(0)
    p.close()
    assert "in_flight=0" in out.getvalue().splitlines()[-1]
    plain = LiveProgress(10, "x", tokens=lambda: 5, enabled=False)  # no expectation: only finished units count
    assert plain.rate() is None
    plain.close()


# ------------------------------------------------------------------ the token counter (real model)


@pytest.mark.slow
def test_llama_cpp_counts_streamed_tokens_while_a_request_runs_and_ends_exact():
    """On the real smoke model: GENERATED_TOKENS rises while generate() is still running, and once it returns it
    has grown by exactly the completions' token counts."""
    pytest.importorskip("xllamacpp")
    from dear.llm import make_backend

    backend = make_backend("smoke", n_parallel=2, n_ctx=512, n_threads=1)
    try:
        req = ChatRequest((ChatMessage("user", "Write a long story about the sea."),), temperature=0.0, seed=1,
                          max_tokens=120)
        before = GENERATED_TOKENS.total()
        seen_in_flight = []
        done = threading.Event()

        def watch():
            while not done.is_set():
                seen_in_flight.append(GENERATED_TOKENS.total() - before)
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        out = backend.generate([req, req])
        done.set()
        watcher.join()
    finally:
        backend.close()
    assert all(c.ok for c in out)
    assert GENERATED_TOKENS.total() - before == sum(c.completion_tokens for c in out)
    assert any(0 < n < sum(c.completion_tokens for c in out) for n in seen_in_flight)


# ------------------------------------------------------------------ training


class SlowBackend:
    """The sim backend, 0.1 s slower per call: a chunk of debates takes several ticks of the display."""

    def __init__(self, inner):
        self.inner = inner
        self.model_id, self.synthetic, self.context_length = inner.model_id, inner.synthetic, inner.context_length

    def generate(self, requests):
        time.sleep(0.1)
        return self.inner.generate(requests)

    def count_tokens(self, text):
        return self.inner.count_tokens(text)

    def close(self):
        self.inner.close()


def test_training_progress_ticks_with_tokens_before_the_first_chunk_ends(tmp_path, monkeypatch):
    import train.workers

    real = train.workers.make_local_backend
    monkeypatch.setattr(train.workers, "make_local_backend", lambda cfg: SlowBackend(real(cfg)))
    monkeypatch.setattr(dear.progress, "REFRESH_S", 0.02)
    snaps, holder, early_display = [], [], []

    def listen(snap):
        snaps.append(snap)
        if snap.done == 0 and snap.tokens > 0 and holder:  # what the line shows before any debate finished
            live = holder[0].logger.live
            early_display.append((live.rate(), live._info.get("in_flight")))

    cfg = load_config("sim-stylised", [*TINY, "run.iterations=1"])
    trainer = Trainer(cfg, run_dir=tmp_path / "run", on_progress=listen)
    holder.append(trainer)
    try:
        trainer.train()
    finally:
        trainer.close()
    early = [s for s in snaps if s.done == 0 and s.tokens > 0]
    assert early, snaps  # tokens counted while the one chunk of 4 debates was still running
    assert early[0].total == 4 and early[0].elapsed_s > 0
    # an ETA (a rate from the tokens so far and the expected tokens per debate) and the 4 debates in flight
    assert early_display and all(rate and rate > 0 and n == "4" for rate, n in early_display), early_display
    assert snaps[-1].done == 4
    assert [s.tokens for s in snaps] == sorted(s.tokens for s in snaps)


def test_resume_says_where_it_continues_and_how_many_debates_it_kept(tmp_path, capsys):
    """Stopped after the first chunk of iteration 1's two: --resume names the run, the iteration and the 4 kept
    debates in one line."""
    run = tmp_path / "run"
    cfg = load_config("sim-stylised", [*TINY, "rollout.episodes_per_iter=8", "run.iterations=2"])
    trainer = Trainer(cfg, run_dir=run)
    real_collect = trainer.pool.collect

    def collect(weights, chunks, on_chunk=None, on_result=None):
        def keep_then_stop(result):
            on_result(result)
            if result.spec.iteration == 1:
                raise KeyboardInterrupt

        return real_collect(weights, chunks, on_chunk, keep_then_stop)

    trainer.pool.collect = collect
    try:
        assert trainer.train().interrupted
    finally:
        trainer.close()
    capsys.readouterr()
    assert main(["--resume", str(run), "logging.progress=false"]) == 0
    out = capsys.readouterr().out
    assert f"resuming {run} from iteration 1/2 (4 finished debates kept)" in out
    assert "start iteration" not in out


def test_a_new_run_names_its_directory(tmp_path, capsys):
    assert main(["--config", "sim-stylised", "--run-dir", str(tmp_path / "new"), *TINY, "run.iterations=1"]) == 0
    assert f"run dir: {tmp_path / 'new'}" in capsys.readouterr().out


# ------------------------------------------------------------------ the llama.cpp thread rule


@pytest.fixture
def machine(monkeypatch):
    """Set this process's cores and the 1-minute load average."""
    monkeypatch.delenv("DEAR_LLAMA_THREADS", raising=False)

    def set_(cores, load):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
        if load is None:
            def no_load():
                raise OSError("no load average")
            monkeypatch.setattr(os, "getloadavg", no_load, raising=False)
        else:
            monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load), raising=False)

    return set_


@pytest.mark.parametrize("cores, load", [(2, 0.3), (2, 1.2), (2, 15.0), (8, 2.6), (4, None)])
def test_threads_are_every_usable_core_whatever_the_load(machine, cores, load):
    """A fixed default (issue 59 item 4): llama.cpp's texts for a seed follow its thread count, so the count never
    follows the machine's load; a busy machine gets a warning line that names DEAR_LLAMA_THREADS instead."""
    machine(cores, load)
    choice = choose_threads()
    assert (choice.threads, choice.cores, choice.load) == (cores, cores, load)
    first, *rest = choice.describe().splitlines()
    assert first.startswith(f"llama.cpp: {cores} threads ({cores} cores, load ")
    assert first.endswith("every usable core, whatever the load; set DEAR_LLAMA_THREADS to override)")
    busy = load is not None and round(load) >= 1
    assert choice.busy == busy and bool(rest) == busy and (choice.warning() is not None) == busy
    if busy:
        assert rest == [choice.warning()] and "DEAR_LLAMA_THREADS=" in rest[0]
        assert rest[0].startswith(f"warning: the machine is busy (load {load:.1f} on {cores} cores)")


def test_dear_llama_threads_and_an_explicit_count_override_the_rule(machine, monkeypatch):
    machine(2, 1.6)
    monkeypatch.setenv("DEAR_LLAMA_THREADS", "3")
    assert choose_threads().threads == 3
    assert choose_threads().describe() == "llama.cpp: 3 threads (DEAR_LLAMA_THREADS=3; 2 cores, load 1.6)"
    assert choose_threads().warning() is None  # the user chose the count: no warning
    assert choose_threads(n_threads=1).threads == 1  # the backend's own argument wins
    monkeypatch.setenv("DEAR_LLAMA_THREADS", "two")
    with pytest.raises(ValueError, match="DEAR_LLAMA_THREADS must be an integer"):
        choose_threads()


# ------------------------------------------------------------------ the long CLIs


def _last_progress_line(err: str, desc: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith(desc + ":")]
    assert lines, err
    return lines[-1]


def test_layout_comparison_and_corpus_show_debates_and_tokens(tmp_path, capsys):
    from eval import layouts
    from simworld import corpus

    assert layouts.main(["--task", "synthetic", "--llm", "sim", "--n", "2", "--chunk", "2",
                         "--out", str(tmp_path / "lay")]) == 0
    n = 2 * len(layouts.ARMS)
    line = _last_progress_line(capsys.readouterr().err, "layouts")
    assert f"{n}/{n}" in line and "tok=" in line and "tok=0," not in line and "tok/s=" in line
    assert corpus.main(["--llm", "sim", "--task", "synthetic", "--layout", "single", "--out", str(tmp_path / "c"),
                        "--n-logging", "3", "--n-mad", "0"]) == 0
    line = _last_progress_line(capsys.readouterr().err, "logging")
    assert "3/3" in line and "tok=0," not in line


@pytest.mark.slow
def test_inference_on_the_smoke_model_shows_rounds_and_tokens(capsys):
    pytest.importorskip("xllamacpp")
    from dear.infer import main as infer

    assert infer(["--llm", "smoke", "--question", "What is 12 + 30?", "--kind", "integer", "--n-rounds", "1",
                  "--max-tokens", "16"]) == 0
    err = capsys.readouterr().err
    line = _last_progress_line(err, "1 debate(s)")
    assert "2/2" in line and "tok=0," not in line and "tok/s=" in line
    assert "llama.cpp: " in err and " cores, load " in err  # the thread count, stated once at start


# ------------------------------------------------------------------ replayed tokens (the bank world)


def test_replayed_tokens_count_in_the_rate_and_the_line_says_they_were_replayed():
    """Issue 59 item 1 in the bank world: tokens of stored samples replayed (no model generated them) still give
    the tokens, tokens/s and an ETA before any unit is done, and the line says they were replayed."""
    generated, replayed = [40], [1000]  # counters that already stood somewhere: the display shows the increase
    out = io.StringIO()
    p = LiveProgress(100, "HAPPO", tokens=lambda: generated[0], replayed=lambda: replayed[0], file=out,
                     refresh_s=3600, line_every_s=3600, expected_tokens_per_unit=500)
    replayed[0] += 250  # half a unit's work, all replayed, nothing finished
    time.sleep(0.05)
    p.tick(line=True)
    line = out.getvalue().splitlines()[-1]
    assert "0/100" in line and "tok=250 replayed," in line and "<?" not in line
    snap = p.snapshot()
    assert (snap.tokens, snap.replayed) == (250, 250)
    assert p.rate() == pytest.approx(0.5 / snap.elapsed_s, rel=0.2)
    generated[0] += 750  # a live model generated the rest
    p.update(2)
    assert p.tokens_per_unit() == 500  # 1,000 tokens, generated or replayed, for 2 units
    p.tick(line=True)
    assert "tok=1,000 (250 replayed)," in out.getvalue().splitlines()[-1]
    p.close()
    only_generated = LiveProgress(1, "x", tokens=lambda: 3, enabled=False)
    assert only_generated.snapshot().replayed == 0
    only_generated.close()


def test_the_expected_tokens_of_a_debate_count_the_turns_that_may_call_the_model():
    """Before the first debate finishes the ETA expects 0.6 x llm.max_tokens per turn that may call the model: in the
    bank world (env.start_width 1) one sample in round 0, then every agent in each later round."""
    from train.runner import EXPECTED_SHARE_OF_MAX_TOKENS, expected_debate_tokens

    bank = load_config("gsm8k")
    assert (bank.env.start_width, bank.env.n_agents, bank.env.n_rounds) == (1, 3, 2)
    assert expected_debate_tokens(bank) == pytest.approx((1 + 3 * 2) * bank.llm.max_tokens * EXPECTED_SHARE_OF_MAX_TOKENS)
    every = load_config("sim-stylised")
    assert every.env.start_width is None
    assert expected_debate_tokens(every) == pytest.approx(
        every.env.n_agents * (every.env.n_rounds + 1) * every.llm.max_tokens * EXPECTED_SHARE_OF_MAX_TOKENS)


def test_the_bank_world_shows_its_replayed_tokens_and_an_eta_on_the_progress_line(tmp_path, capsys):
    """The main job's world in small (configs/gsm8k-quick on the committed bank): the progress line counts the
    replayed samples' tokens (it once showed tok=0 there), says they were replayed, and shows an ETA."""
    cfg = load_config("gsm8k-quick", ["env.encoder=hashing", "run.iterations=1", "rollout.episodes_per_iter=16",
                                      f"run.out_dir={tmp_path}"])
    snaps = []
    trainer = Trainer(cfg, progress=True, on_progress=snaps.append)
    try:
        trainer.train()
    finally:
        trainer.close()
    end = [s for s in snaps if s.done == 16]
    assert end and end[-1].tokens > 0 and end[-1].replayed == end[-1].tokens  # no model generated any of them
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("HAPPO:")]
    assert lines and "16/16" in lines[-1] and " replayed, tok/s=" in lines[-1] and "<?" not in lines[-1], lines


def test_the_ray_pool_polls_its_engines_for_generated_and_replayed_tokens():
    """With LLM engine actors the driver asks each for both counts; with in-worker backends the tokens of returned
    chunks count whole (replayed ones included) and nothing is reported apart as replayed."""
    from dear.llm.base import REPLAYED_TOKENS
    from train.workers import LLMEngine, RayPool

    class Remote:
        def __init__(self, value):
            self.value = value

        def remote(self):
            return self.value

    class Engine:
        def __init__(self, generated, replayed):
            self.generated_tokens, self.replayed_tokens = Remote(generated), Remote(replayed)

    class Ray:
        @staticmethod
        def get(refs, timeout=None):
            return list(refs)

    pool = RayPool.__new__(RayPool)  # no Ray: only the counters
    pool.ray, pool.engines = Ray(), [Engine(5, 100), Engine(0, 50)]
    pool._engine_tokens = pool._engine_replayed = pool._chunk_tokens = 0
    assert (pool.generated_tokens(), pool.replayed_tokens()) == (5, 150)
    pool.engines, pool._chunk_tokens = [], 70
    assert (pool.generated_tokens(), pool.replayed_tokens()) == (70, 0)
    assert LLMEngine.replayed_tokens(None) == REPLAYED_TOKENS.total()
