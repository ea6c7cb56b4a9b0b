"""eval.run as a harness: failed debates are retried by the same command (sim backend and a real HTTP server
on 127.0.0.1), the stored round 0 is shared and verified, MAD stopped at unanimity, the density-matched
random mask, the settings guard, --n-boot, the policy's sampling mode and training world, and a slow run on
the smoke model."""

from __future__ import annotations

import csv
import json
import re
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dear.debate.prompts import LAYOUTS
from dear.debate.trace import read_jsonl
from dear.llm.base import Completion
from dear.sim import SimBackend
from eval import run as eval_run
from tests import ROOT
from tests.eval.test_eval_run_end_to_end import make_train_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_train_checkpoint(tmp_path_factory.mktemp("run"))


def args(out: Path, *extra: str, methods: str = "cot,majority,mad", n: int = 4, ckpt: Path | None = None,
         llm: str = "sim") -> list[str]:
    a = ["--benchmarks", "synthetic", "--n", str(n), "--llm", llm, "--methods", methods, "--seed", "0",
         "--out", str(out), "--batch", "2", "--n-boot", "100", "--no-progress", *extra]
    return a + (["--checkpoint", str(ckpt)] if ckpt else [])


def rows(out: Path) -> dict[str, dict[str, str]]:
    return {r["method"]: r for r in csv.DictReader((out / "summary.csv").open())}


class OutageSim(SimBackend):
    """The sim backend behind an outage: while `down`, requests of the given rounds (all when None) and
    questions (all when None) fail the way a real backend reports a failure after its retries."""

    def __init__(self, rounds: set[int] | None = None, questions: set[str] | None = None):
        super().__init__()
        self.down = True
        self.rounds, self.questions = rounds, questions
        self.failed = 0

    def _hit(self, r) -> bool:
        return self.down and (self.rounds is None or r.metadata["round"] in self.rounds) and \
            (self.questions is None or r.metadata["question_id"] in self.questions)

    def generate(self, requests):
        ok = [r for r in requests if not self._hit(r)]
        done = iter(super().generate(ok))
        out = []
        for r in requests:
            if self._hit(r):
                self.failed += 1
                out.append(Completion("", 0, 0, "error", 0.0, error="HTTP 503: backend down (after 5 retries)"))
            else:
                out.append(next(done))
        return out


# ---------------------------------------------------------------- A: failures are retried
def test_exchange_outage_then_recovery_same_command(tmp_path):
    out = tmp_path / "res"
    be = OutageSim(rounds={1, 2})
    results = eval_run.main(args(out), backend=be)
    assert be.failed > 0
    # the debates failed: MAD has nothing finished, its failures are listed, nothing of MAD is "done"
    assert {r.method for r in results} == {"cot", "majority"}
    md = (out / "summary.md").read_text()
    assert "## Failed debates that remain" in md and md.count("| synthetic | MAD |") == 4
    assert "HTTP 503" in md
    assert "\tmad\t" not in (out / "done.tsv").read_text()
    assert all(t.failed for t in read_jsonl(out / "traces" / "synthetic" / "mad.jsonl"))
    # backend back: the same command retries the failed debates and recovers
    be.down = False
    results = eval_run.main(args(out), backend=be)
    assert {r.method: r.summary.n for r in results} == {"cot": 4, "majority": 4, "mad": 4}
    assert "Failed debates that remain" not in (out / "summary.md").read_text()
    # ...to exactly what a directory that never saw the outage reports
    fresh = eval_run.main(args(tmp_path / "fresh"), backend=SimBackend())
    assert {r.method: r.summary.accuracy.mean for r in results} == {r.method: r.summary.accuracy.mean for r in fresh}
    assert [r["accuracy"] for r in rows(out).values()] == [r["accuracy"] for r in rows(tmp_path / "fresh").values()]


def test_total_outage_fails_clearly_then_round0_is_retried(tmp_path):
    out = tmp_path / "res"
    be = OutageSim()
    with pytest.raises(ValueError, match=r"no finished debates to report \(\d+ failed on backend errors; run the "
                                         r"same command again"):
        eval_run.main(args(out, methods="cot,mad"), backend=be)
    assert all(t.failed for t in read_jsonl(out / "traces" / "synthetic" / "round0.jsonl"))
    be.down = False
    results = eval_run.main(args(out, methods="cot,mad"), backend=be)
    assert [r.summary.n for r in results] == [4, 4]


def test_one_failed_question_is_left_out_and_counted(tmp_path):
    out = tmp_path / "res"
    qid = eval_run.tasks.load("synthetic", n=4, seed=0)[1].id
    be = OutageSim(rounds={1}, questions={qid})
    results = eval_run.main(args(out, methods="cot,mad"), backend=be)
    # accuracy over the finished debates only, the failed count beside it
    assert [r.summary.n for r in results] == [3, 3]
    r = rows(out)
    assert r["mad"]["failed_pending"] == "1" and r["cot"]["failed_pending"] == "0"
    md = (out / "summary.md").read_text()
    assert f"| synthetic | MAD | {qid} |" in md and "synthetic: 3 of 4 requested" in md
    mad_row = next(line for line in md.splitlines() if line.startswith("| MAD | 3 |"))
    assert mad_row.split("|")[9].strip() == "1"  # the "failed" column
    be.down = False
    assert [r.summary.n for r in eval_run.main(args(out, methods="cot,mad"), backend=be)] == [4, 4]


class OpenAIStub:
    """A minimal OpenAI-compatible chat server on 127.0.0.1 that answers synthetic questions correctly from
    their header; while `down`, every completion request gets HTTP 503."""

    def __init__(self):
        self.down = True
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "stub", "max_model_len": 8192}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                owner.requests += 1
                if owner.down:
                    return self._send(503, {"error": "server restarting"})
                user = body["messages"][-1]["content"]
                answer = re.search(r"answer=(\S+)", user).group(1)
                text = f"Reasoning: I add it up.\nConclusion: The result is {answer}.\nFinal answer: \\boxed{{{answer}}}"
                self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": len(user) // 4, "completion_tokens": 20}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_http_server_down_then_up_same_command(tmp_path):
    """A real OpenAI-compatible HTTP server that restarts: the rerun recovers the debates it lost."""
    from dear.llm.openai_compat import OpenAICompatBackend

    server = OpenAIStub()
    try:
        spec = f"openai:{server.url}#stub"
        out = tmp_path / "res"

        def backend():
            return OpenAICompatBackend(server.url, model="stub", max_retries=0, backoff_base_s=0.01)

        with pytest.raises(ValueError, match="no finished debates to report"):
            eval_run.main(args(out, "--no-cache", llm=spec, methods="majority,mad"), backend=backend())
        assert server.requests > 0
        server.down = False
        results = eval_run.main(args(out, "--no-cache", llm=spec, methods="majority,mad"), backend=backend())
        assert [(r.method, r.summary.n, r.summary.accuracy.mean) for r in results] == [("majority", 4, 1.0),
                                                                                        ("mad", 4, 1.0)]
        assert "Failed debates that remain" not in (out / "summary.md").read_text()
    finally:
        server.close()


# ---------------------------------------------------------------- B: round 0 stored and shared
def test_round0_is_stored_once_widened_and_verified(tmp_path):
    out = tmp_path / "res"
    be = SimBackend()
    eval_run.main(args(out, "--sc-samples", "5", methods="majority,mad"), backend=be)
    r0_path = out / "traces" / "synthetic" / "round0.jsonl"
    first = {t.question_id: t for t in read_jsonl(r0_path)}
    assert len(first) == 4 and all(t.n_agents == 3 for t in first.values())
    # adding self-consistency with 5 samples widens round 0, keeping the stored answers and asking only for the
    # new agents' samples, which equal those of a round 0 generated 5 wide at once
    sent = []
    counting = SimBackend()
    counting_generate = counting.generate
    counting.generate = lambda reqs: (sent.extend(reqs), counting_generate(reqs))[1]
    eval_run.main(args(out, "--sc-samples", "5", methods="majority,mad,sc"), backend=counting)
    wide = {t.question_id: t for t in read_jsonl(r0_path)}
    assert all(t.n_agents == 5 for t in wide.values())
    assert sorted(r.metadata["agent"] for r in sent if r.metadata["round"] == 0) == [3] * 4 + [4] * 4
    for qid, t in first.items():
        assert [a.text for a in wide[qid].rounds[0][:3]] == [a.text for a in t.rounds[0]]
    at_once = tmp_path / "at-once"
    eval_run.main(args(at_once, "--sc-samples", "5", methods="sc"), backend=SimBackend())
    for t in read_jsonl(at_once / "traces" / "synthetic" / "round0.jsonl"):
        assert [(a.text, a.seed) for a in t.rounds[0]] == [(a.text, a.seed) for a in wide[t.question_id].rounds[0]]
    sc = {t.question_id: t for t in read_jsonl(out / "traces" / "synthetic" / "sc.jsonl")}
    assert all([a.text for a in sc[q].rounds[0]] == [a.text for a in wide[q].rounds[0]] for q in sc)
    # a method whose round 0 differs from the stored one fails the run, naming it
    mad_path = out / "traces" / "synthetic" / "mad.jsonl"
    lines = mad_path.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["rounds"][0][2]["text"] += " (generated again)"
    mad_path.write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n")
    with pytest.raises(eval_run.Round0Mismatch, match=rf"synthetic/mad: question {bad['question_id']}, agent 2: "
                                                      r"round-0 text differs from the stored round 0"):
        eval_run.main(args(out, "--sc-samples", "5", "--report-only", methods="majority,mad,sc"), backend=be)


def test_mad_stop_when_unanimous(tmp_path):
    out = tmp_path / "res"
    results = eval_run.main(args(out, methods="mad,mad-stop", n=12), backend=SimBackend())
    mad = {t.question_id: t for t in read_jsonl(out / "traces" / "synthetic" / "mad.jsonl")}
    stop = {t.question_id: t for t in read_jsonl(out / "traces" / "synthetic" / "mad-stop.jsonl")}
    n_short = 0
    for qid, t in stop.items():
        keys = t.answer_keys()
        unanimous = [r for r, k in enumerate(keys) if k[0] is not None and len(set(k)) == 1]
        if unanimous:  # ends right after the first unanimous round, with that answer
            assert len(t.rounds) == unanimous[0] + 1 and t.final_answer == keys[unanimous[0]][0]
            n_short += len(t.rounds) < 3
        else:
            assert len(t.rounds) == 3
        # the same debate as MAD up to where it stopped, charged only for the rounds it ran
        assert [[a.text for a in r] for r in t.rounds] == [[a.text for a in r] for r in mad[qid].rounds[:len(t.rounds)]]
        assert t.total_tokens == sum(a.prompt_tokens + a.completion_tokens for r in t.rounds for a in r)
        assert t.total_tokens <= mad[qid].total_tokens
    assert n_short > 0  # the sim has unanimous questions at round 0 (about a third)
    by = {r.method: r for r in results}
    assert by["mad-stop"].summary.total_tokens.mean < by["mad"].summary.total_tokens.mean
    assert "MAD stop-when-unanimous" in (out / "summary.md").read_text()


def test_density_matched_random_mask(tmp_path, ckpt):
    out = tmp_path / "res"
    with pytest.raises(ValueError, match="DEAR has no finished debates there: add dear to --methods"):
        eval_run.main(args(out, methods="dear-random-mask", ckpt=ckpt), backend=SimBackend())
    results = eval_run.main(args(tmp_path / "ok", methods="dear-random-mask,dear", n=16, ckpt=ckpt),
                            backend=SimBackend())
    by = {r.method: r.summary for r in results}
    dear, rnd = by["dear"].read_density, by["dear-random-mask"].read_density
    assert len(dear) == len(rnd) == 2
    # 16 debates x 6 pairs per round: the realized density follows DEAR's within sampling noise
    for d, r in zip(dear, rnd):
        assert abs(d - r) < 0.2, (dear, rnd)
    md = (tmp_path / "ok" / "summary.md").read_text()
    assert "Read density per exchange round" in md and "DEAR random-mask (sim-trained)" in md
    # the pair probability it used is DEAR's realized density, recorded and stated
    used = json.loads((tmp_path / "ok" / "run.json").read_text())["random_mask_density"]["synthetic"]
    assert used == pytest.approx(dear)
    assert f"each pair read with probability {used[0]:.3f}" in md


# ---------------------------------------------------------------- settings guard, n-boot, policy mode, labels
def test_settings_guard_covers_backend_options_checkpoint_hash_and_modes(tmp_path, ckpt):
    out = tmp_path / "res"
    run = make_train_checkpoint(tmp_path / "run")
    eval_run.main(args(out, methods="mad,dear", n=2, ckpt=run), backend=SimBackend())
    settings = json.loads((out / "run.json").read_text())["settings"]
    assert len(settings["checkpoint_sha256"]) == 64 and settings["policy_sampling"] == "deterministic"
    assert settings["layout"] in LAYOUTS
    with pytest.raises(ValueError, match=r"backend_options: \{\} there vs \{'n_ctx': 4096\} now"):
        eval_run.main(args(out, "--n-ctx", "4096", methods="mad,dear", n=2, ckpt=run), backend=SimBackend())
    with pytest.raises(ValueError, match="policy_sampling: 'deterministic' there vs 'sampled' now"):
        eval_run.main(args(out, "--policy-sampling", "sampled", methods="mad,dear", n=2, ckpt=run),
                      backend=SimBackend())
    # the same run directory, trained further: other weights at the same path
    latest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip() / "model.safetensors"
    from safetensors.torch import load_file, save_file

    from dear.integrity import CHECKSUMS_FILE, write_checksums
    from train.checkpoint import CHECKPOINT_FILES

    w = load_file(str(latest))
    save_file({k: v + 0.01 for k, v in w.items()}, str(latest))
    write_checksums(latest.parent, CHECKPOINT_FILES, CHECKSUMS_FILE)  # a legitimately re-saved checkpoint
    with pytest.raises(ValueError, match="checkpoint_sha256: '[0-9a-f]{64}' there vs '[0-9a-f]{64}' now"):
        eval_run.main(args(out, methods="mad,dear", n=2, ckpt=run), backend=SimBackend())


def test_the_same_policy_at_another_path_resumes(tmp_path):
    """A checkout elsewhere names the same weights at another absolute path: the sha256, not the path, decides."""
    out = tmp_path / "res"
    run = make_train_checkpoint(tmp_path / "run")
    eval_run.main(args(out, methods="mad,dear", n=2, ckpt=run), backend=SimBackend())
    moved = Path(shutil.copytree(run, tmp_path / "elsewhere" / "run"))
    eval_run.main(args(out, methods="mad,dear", n=3, ckpt=moved), backend=SimBackend())
    dear_traces = (out / "traces" / "synthetic" / "dear.jsonl").read_text().splitlines()
    assert len({json.loads(x)["question_id"] for x in dear_traces}) == 3


def test_layout_flag_reaches_the_engine_and_the_settings_guard(tmp_path):
    out = tmp_path / "res"
    eval_run.main(args(out, "--layout", "multiturn", methods="mad", n=2), backend=SimBackend())
    assert json.loads((out / "run.json").read_text())["settings"]["layout"] == "multiturn"
    traces = [json.loads(x) for x in (out / "traces" / "synthetic" / "mad.jsonl").read_text().splitlines()]
    roles = [m["role"] for m in traces[0]["rounds"][2][0]["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]  # the multi-turn conversation
    with pytest.raises(ValueError, match="layout: 'multiturn' there vs 'single' now"):
        eval_run.main(args(out, "--layout", "single", methods="mad", n=2), backend=SimBackend())


def test_n_boot_reaches_every_bootstrap(tmp_path, monkeypatch):
    import dear.metrics

    seen: list[int] = []
    orig = dear.metrics.bootstrap_ci

    def spy(values, n_boot=2000, **kw):
        seen.append(n_boot)
        return orig(values, n_boot=n_boot, **kw)

    monkeypatch.setattr(dear.metrics, "bootstrap_ci", spy)
    eval_run.main(args(tmp_path / "res", "--n-boot", "137", methods="cot,majority,mad"), backend=SimBackend())
    assert seen and set(seen) == {137}  # accuracy, tokens and the paired differences
    assert "137 bootstrap resamples" in (tmp_path / "res" / "summary.md").read_text()


def test_policy_sampling_is_stated_and_reproducible(tmp_path, ckpt):
    res = {}
    for name in ("a", "b"):
        out = tmp_path / name
        eval_run.main(args(out, "--policy-sampling", "sampled", methods="dear", n=4, ckpt=ckpt),
                      backend=SimBackend())
        assert "**Policy actions:** sampled" in (out / "summary.md").read_text()
        res[name] = [[a.text for r in t.rounds for a in r]
                     for t in read_jsonl(out / "traces" / "synthetic" / "dear.jsonl")]
    assert res["a"] == res["b"]
    det = tmp_path / "det"
    eval_run.main(args(det, methods="dear", n=4, ckpt=ckpt), backend=SimBackend())
    assert "**Policy actions:** deterministic" in (det / "summary.md").read_text()


def test_policy_world_label_everywhere(tmp_path, ckpt):
    out = tmp_path / "res"
    eval_run.main(args(out, "--policy-world", "sim-fitted", methods="mad,dear,dear-no-behavior", n=2, ckpt=ckpt),
                  backend=SimBackend())
    labels = [r["label"] for r in rows(out).values()]
    assert labels == ["MAD", "DEAR (sim-fitted)", "DEAR w/o behavior (sim-fitted)"]
    md = (out / "summary.md").read_text()
    assert "| DEAR (sim-fitted) |" in md and "| DEAR |" not in md


def test_committed_legacy_report_stays_readable(tmp_path):
    """The committed real report (written before round 0 was stored) re-renders from a copy; extending it is
    refused with a clear message."""
    src = ROOT / "results" / "embedded-gsm8k-math500"
    if not (src / "run.json").exists():
        pytest.skip("committed report not present")
    out = tmp_path / "legacy"
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.png"))
    stored = json.loads((out / "run.json").read_text())["settings"]
    base = ["--checkpoint", str(out / "policy"), "--benchmarks", "gsm8k,math500", "--n", "20",
            "--llm", "local", "--methods", "cot,majority,mad,dear", "--max-tokens", str(stored["max_tokens"]),
            "--parallel", "6", "--n-ctx", "3072", "--batch", "2", "--out", str(out), "--no-progress"]
    results = eval_run.main(base + ["--report-only"])
    assert {r.summary.n for r in results} == {16}
    md = (out / "summary.md").read_text()
    assert "was not stored (an older eval.run wrote these traces)" in md and "DEAR (sim-trained)" in md
    with pytest.raises(ValueError, match=r"predates the settings \['checkpoint_sha256', 'layout', "
                                         r"'policy_sampling'\].*--report-only or use a fresh --out"):
        eval_run.main(base)


# ---------------------------------------------------------------- the smoke model
@pytest.mark.slow
def test_smoke_model_harness(tmp_path):
    """SmolLM2-135M through llama.cpp: every new part of the harness on 2 real GSM8K questions."""
    out = tmp_path / "real"
    run = make_train_checkpoint(tmp_path / "run", llm_preset="smoke", encoder="minilm")
    a = ["--checkpoint", str(run), "--benchmarks", "gsm8k", "--n", "2", "--llm", "smoke", "--methods",
         "cot,majority,mad,mad-stop,dear,dear-random-mask", "--n-rounds", "1", "--max-tokens", "64",
         "--out", str(out), "--no-progress", "--n-boot", "200", "--batch", "2"]
    results = eval_run.main(a)
    assert {r.method for r in results} == {"cot", "majority", "mad", "mad-stop", "dear", "dear-random-mask"}
    round0 = {t.question_id: t for t in read_jsonl(out / "traces" / "gsm8k" / "round0.jsonl")}
    assert len(round0) == 2
    for m in ("cot", "majority", "mad", "mad-stop", "dear", "dear-random-mask"):
        for t in read_jsonl(out / "traces" / "gsm8k" / f"{m}.jsonl"):
            assert [x.text for x in t.rounds[0]] == [x.text for x in round0[t.question_id].rounds[0][:len(t.rounds[0])]]
            for turn in (x for r in t.rounds for x in r):
                if turn.finish_reason == "length" and "boxed" not in turn.text and "answer" not in turn.text.lower():
                    assert turn.answer is None  # a cut completion without a marked answer does not answer
    by = {r.method: r.summary for r in results}
    assert by["mad"].truncated.den > 0  # the rate is measured on real completions
    md = (out / "summary.md").read_text()
    assert "SYNTHETIC" not in md and "DEAR (smoke-trained)" in md and "truncated % (no answer)" in md
    # a rerun of the same command has nothing left to do and does not change the stored round 0
    before = (out / "traces" / "gsm8k" / "round0.jsonl").read_text()
    eval_run.main(a)
    assert (out / "traces" / "gsm8k" / "round0.jsonl").read_text() == before


def test_a_damaged_timings_file_is_named(tmp_path):
    out = tmp_path / "res"
    eval_run.main(args(out, methods="mad", n=2), backend=SimBackend())
    (out / "timings.json").write_text('{"synthetic": 1.')
    with pytest.raises(ValueError, match=r"timings.json: generation timings cannot be parsed"):
        eval_run.main(args(out, methods="mad", n=3), backend=SimBackend())


@pytest.mark.parametrize("extra", [["--llm", "sim"], ["--llm", "local", "--agent-profiles", "cot,sim:direct"]])
def test_the_sim_is_refused_for_a_real_benchmark_before_any_call(tmp_path, extra):
    out = tmp_path / "res"
    with pytest.raises(ValueError, match="--llm sim answers only --benchmarks synthetic, not gsm8k"):
        eval_run.main(["--benchmarks", "synthetic,gsm8k", "--n", "2", "--methods", "cot", "--out", str(out),
                       "--no-progress", *extra])
    assert not out.exists()


def test_a_profile_policy_says_so_in_its_labels(tmp_path):
    """Two policies of one mixed pool, with and without the profile feature, must not share a label."""
    from dear.export import export_policy
    from dear.policy import JointPolicy, PolicyConfig

    policy = export_policy(JointPolicy(PolicyConfig(n_agents=3, profiles=("cot", "direct"))), tmp_path / "p",
                           encoder="hashing", training={"n_rounds": 2, "llm": "sim"})
    out = tmp_path / "res"
    eval_run.main(args(out, "--agent-profiles", "cot,cot,direct", methods="majority,dear,dear-random-mask", n=2,
                       ckpt=policy))
    labels = [r["label"] for r in rows(out).values()]
    assert labels == ["Round-0 majority", "DEAR+profiles (sim-trained)", "DEAR+profiles random-mask (sim-trained)"]
