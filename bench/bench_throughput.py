"""Debate throughput against the backend's decode limit, measured in one run on one backend.

    python bench/bench_throughput.py --llm local --questions 6 --parallel 9 --max-tokens 384
    python bench/bench_throughput.py --llm smoke --questions 3 --parallel 6 --max-tokens 48   # plumbing

Passes over the same GSM8K questions, V agents, R exchange rounds (MAD), each on a fresh backend of one spec:

1. raw: every call the debates will make, as independent round-0 requests (one per question, agent and round,
   each with its own seed) in one batch call that keeps all `--parallel` slots busy: the backend's batched
   decode limit for this number of calls and tokens;
2. before: the single-message layout with rounds in lockstep (`DebateEngine.run` on `parallel // V` debates at
   a time), what the project did before the multi-turn layout;
3. after: the multi-turn layout with each debate at its own pace (`DebateEngine.run_concurrent`), every agent
   kept on one KV-cache slot.

4. with `--speculative TYPE`: pass 3 again on a backend with llama.cpp's draftless speculative decoding (the same
   answer distribution; drafts from n-grams already in each slot's context), with its draft acceptance;
5. prompt reading: every prompt of pass 3 sent again for one token, all at once on a fresh backend: the backend's
   batched prompt-reading rate.

It prints completion tokens per second of each and the ratios before/raw and after/raw (target: after >= 0.8),
with the prompt tokens the server computed vs reused and, on llama.cpp, how the slots spent the pass (share of
wall time x slots reading prompts, generating, idle). Results also go to --out as JSON.

A debate must read its peers' answers: pass 3's computed prompt tokens are work that raw decoding never does.
From passes 1 and 5 the bench prints the ceiling this puts on the ratio, with every slot busy and no time lost
at a round's end: after's completion tokens over (their pure decode time + its computed prompt tokens at the
measured reading rate), over raw's tokens per second. `after / ceiling` is then the share the scheduling loses.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from dear import tasks  # noqa: E402
from dear.debate import DebateConfig, DebateEngine, MADProtocol, prompts  # noqa: E402
from dear.atomic import write_json  # noqa: E402
from dear.cli import run as run_cli  # noqa: E402
from dear.debate.cli_args import OMIT, add_backend_args, add_debate_args, add_question_args  # noqa: E402
from dear.llm.base import Backend, ChatMessage, ChatRequest  # noqa: E402
from dear.llm.registry import make_backend, options_for  # noqa: E402

PROG = "python bench/bench_throughput.py"


AFTER = "after: multiturn layout, concurrent debates"


@dataclass
class Pass:
    name: str
    calls: int
    wall_s: float
    completion_tokens: int
    prompt_tokens: int
    reused_prompt_tokens: int
    errors: int
    prompt_slot_s: float | None = None  # slot-seconds llama.cpp spent reading prompts (its `timings`)
    decode_slot_s: float | None = None  # ... and generating

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def computed_prompt_tokens(self) -> int:
        """Prompt tokens the server read (not taken from its KV cache)."""
        return self.prompt_tokens - self.reused_prompt_tokens

    def slot_use(self, n_slots: int) -> tuple[float, float] | None:
        """(share of slot-time reading prompts, share generating) over wall time x slots; None without timings."""
        if self.prompt_slot_s is None or self.decode_slot_s is None or self.wall_s <= 0:
            return None
        total = self.wall_s * n_slots
        return self.prompt_slot_s / total, self.decode_slot_s / total


def raw_pass(backend: Backend, questions, config: DebateConfig) -> Pass:
    """Independent round-0 requests, as many as the debates make, in one call (the slots never starve)."""
    requests = [
        ChatRequest(messages=tuple(prompts.round0_messages(q)), temperature=config.temperature0,
                    top_p=config.top_p0, max_tokens=config.max_tokens, seed=7919 * k + 13 * a + r)
        for k, q in enumerate(questions) for a in range(config.n_agents) for r in range(config.n_rounds + 1)
    ]
    t0 = time.perf_counter()
    out = backend.generate(requests)
    return Pass("raw batched decode", len(requests), time.perf_counter() - t0,
                sum(c.completion_tokens for c in out), sum(c.prompt_tokens for c in out),
                sum(c.reused_prompt_tokens for c in out), sum(not c.ok for c in out))


def debate_pass(name: str, backend: Backend, questions, config: DebateConfig, in_flight: int,
                concurrent: bool, sent: list | None = None) -> Pass:
    """One debate pass; the chats it sent are appended to `sent` (for the prompt-reading pass)."""
    engine = DebateEngine(backend, config)
    protocol = MADProtocol(config.n_agents, config.n_rounds, config.temperature0, config.top_p0)
    t0 = time.perf_counter()
    if concurrent:
        debates = engine.run_concurrent(questions, protocol, max_in_flight=in_flight)
    else:
        debates = [d for k in range(0, len(questions), in_flight)
                   for d in engine.run(questions[k:k + in_flight], protocol)]
    wall = time.perf_counter() - t0
    turns = [t for d in debates for r in d.trace.rounds for t in r]
    if sent is not None:
        sent.extend(t.messages for t in turns)
    return Pass(name, len(turns), wall, sum(t.completion_tokens for t in turns),
                sum(t.prompt_tokens for t in turns), sum(t.reused_prompt_tokens for t in turns),
                sum(t.error is not None for t in turns))


def prompt_pass(backend: Backend, chats: list) -> Pass:
    """The given chats, one token each, in one batch call without sessions: the batched prompt-reading rate."""
    requests = [ChatRequest(messages=tuple(ChatMessage(m["role"], m["content"]) for m in chat), temperature=0.0,
                            top_p=1.0, max_tokens=1, seed=k)
                for k, chat in enumerate(chats)]
    t0 = time.perf_counter()
    out = backend.generate(requests)
    return Pass("prompt reading (pass 3's prompts, 1 token each)", len(requests), time.perf_counter() - t0,
                sum(c.completion_tokens for c in out), sum(c.prompt_tokens for c in out),
                sum(c.reused_prompt_tokens for c in out), sum(not c.ok for c in out))


@dataclass
class Ceiling:
    """The best ratio to raw a debate pass can reach when its computed prompts cost their measured reading time."""

    prompt_tokens_per_s: float  # batched prompt reading (pass 5)
    decode_tokens_per_s: float  # raw's completion tokens over raw's wall minus its own prompt reading
    ratio: float  # the ceiling on tokens_per_s / raw
    share_reached: float  # the pass's actual ratio over the ceiling


def ceiling(raw: Pass, debate: Pass, reading: Pass) -> Ceiling | None:
    computed = reading.computed_prompt_tokens
    if reading.wall_s <= 0 or computed <= 0 or raw.tokens_per_s <= 0:
        return None
    prompt_rate = computed / reading.wall_s
    decode_wall = raw.wall_s - raw.computed_prompt_tokens / prompt_rate
    if decode_wall <= 0:
        return None
    decode_rate = raw.completion_tokens / decode_wall
    best_wall = (debate.completion_tokens / decode_rate
                 + debate.computed_prompt_tokens / prompt_rate)
    ratio = debate.completion_tokens / best_wall / raw.tokens_per_s
    return Ceiling(prompt_rate, decode_rate, ratio, debate.tokens_per_s / raw.tokens_per_s / ratio)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_question_args(p, task=OMIT, split=OMIT, data_seed=21,
                      data_seed_note="GSM8K train questions (kept off the test split)")
    p.add_argument("--questions", type=int, default=6)
    add_backend_args(p, max_tokens=384, parallel=9, n_ctx=3072, speculative=True,
                     speculative_note="adds pass 4 with this speculative decoding")
    p.add_argument("--in-flight", type=int, default=None, help="debates at once (default parallel // agents)")
    add_debate_args(p)
    p.add_argument("--skip-before", action="store_true", help="leave out pass 2 (the old layout)")
    p.add_argument("--out", type=Path, default=None, help="also write the passes here (JSON)")
    a = p.parse_args(argv)
    in_flight = a.in_flight or max(1, a.parallel // a.n_agents)
    questions = tasks.load("gsm8k", split="train", n=a.questions, seed=a.data_seed)
    kwargs = options_for(a.llm, {"n_parallel": a.parallel, "n_ctx": a.n_ctx})
    base = DebateConfig(n_agents=a.n_agents, n_rounds=a.n_rounds, max_tokens=a.max_tokens, seed=a.seed)
    after = replace(base, layout="multiturn")
    after_chats: list = []
    runs = [  # (pass, backend options); each pass on a fresh backend, so no pass starts with another's KV cache
        (lambda b: raw_pass(b, questions, base), {}),
        (lambda b: debate_pass("before: single layout, lockstep rounds", b, questions, replace(base, layout="single"),
                               in_flight, concurrent=False), {}),
        (lambda b: debate_pass(AFTER, b, questions, after, in_flight, concurrent=True, sent=after_chats), {}),
    ]
    if a.skip_before:
        del runs[1]
    if a.speculative:
        runs.append((lambda b: debate_pass(f"after + speculative {a.speculative}", b, questions, after, in_flight,
                                           concurrent=True), {"speculative": a.speculative}))
    runs.append((lambda b: prompt_pass(b, after_chats), {}))
    passes, drafts = [], None
    for run, options in runs:
        with make_backend(a.llm, **kwargs, **options) as backend:
            ps = run(backend)
            timings = getattr(backend, "server_timings", None)  # llama.cpp backends only
            if timings is not None:
                ps = replace(ps, prompt_slot_s=timings.prompt_ms / 1000, decode_slot_s=timings.predicted_ms / 1000)
            passes.append(ps)
            if options.get("speculative"):
                drafts = backend.server_timings
    reading = passes.pop()  # pass 5 measures a rate; it is no debate pass to rank against raw
    raw = passes[0].tokens_per_s
    after_pass = next(ps for ps in passes if ps.name == AFTER)
    limit = ceiling(passes[0], after_pass, reading)
    print(f"{a.llm}: {a.questions} GSM8K questions, V={a.n_agents}, R={a.n_rounds}, {a.max_tokens} max tokens, "
          f"{a.parallel} slots, {in_flight} debates in flight, seed {a.seed}")
    print(f"{'pass':46s} {'calls':>5s} {'wall s':>7s} {'compl tok':>9s} {'tok/s':>6s} {'ratio':>6s} "
          f"{'prompt computed/reused':>23s} {'errors':>6s}")
    for ps in passes:
        print(f"{ps.name:46s} {ps.calls:5d} {ps.wall_s:7.1f} {ps.completion_tokens:9d} {ps.tokens_per_s:6.1f} "
              f"{ps.tokens_per_s / raw if raw else 0:6.2f} "
              f"{ps.computed_prompt_tokens:>11d}/{ps.reused_prompt_tokens:<11d} {ps.errors:6d}")
    for ps in passes:  # where the gap to raw goes: slots reading prompts, or idle (waiting at a round's end)
        use = ps.slot_use(a.parallel)
        if use is not None:
            print(f"  {ps.name}: slot-time {100 * use[0]:.0f} % reading prompts, {100 * use[1]:.0f} % generating, "
                  f"{100 * (1 - sum(use)):.0f} % idle")
    if limit is not None:
        print(f"prompt reading: {reading.computed_prompt_tokens} tokens in {reading.wall_s:.1f} s "
              f"= {limit.prompt_tokens_per_s:.0f} tok/s; pure decode {limit.decode_tokens_per_s:.1f} tok/s")
        print(f"ceiling for after (its computed prompts read at that rate, no idle slot): {limit.ratio:.2f} of raw; "
              f"after reached {limit.share_reached:.2f} of the ceiling")
    if drafts is not None:
        print(f"speculative {a.speculative}: {drafts.accepted} of {drafts.drafted} draft tokens accepted "
              f"({drafts.acceptance:.2f})")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        write_json(a.out, {"args": vars(a) | {"out": str(a.out)}, "passes": [
            asdict(ps) | {"tokens_per_s": ps.tokens_per_s, "ratio_to_raw": ps.tokens_per_s / raw if raw else None,
                          "slot_use_prompt_decode": ps.slot_use(a.parallel)}
            for ps in passes], "prompt_reading": asdict(reading),
            "ceiling_after": None if limit is None else asdict(limit), "draft_tokens": None if drafts is None else {
                "drafted": drafts.drafted, "accepted": drafts.accepted}},
            indent=2, trailing_newline=True)
    return 1 if any(ps.errors for ps in passes) else 0


if __name__ == "__main__":
    run_cli(main, PROG)
