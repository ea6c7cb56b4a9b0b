"""Many concurrent OpenAI clients against a real `python -m dear.serve --llm sim` on 127.0.0.1.

    python bench/bench_serve.py                                   # 200 clients, --max-active 32, model dear
    python bench/bench_serve.py --clients 50 --model mad --out results/bench-serve

Starts the server as a subprocess on a free port (the shipped policy unless `--policy`; the synthetic
debaters, so no LLM: what is measured is the server, the scheduler, the regulator and its encoder, and HTTP),
then releases `--clients` `openai.AsyncOpenAI` clients at once, each with its own connection pool, all in this
one process, one synthetic question each (`load_synthetic(seed=--seed)`, request seed `--seed` + k). Prints
the latency percentiles, errors and throughput, the server's scheduler counters, and the command and seed;
`--out DIR` also writes `summary.json` there. Client and server share this machine's CPUs: the load average
before and after is printed so a busy machine shows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from dear.atomic import write_json  # noqa: E402
from dear.export import SHIPPED_POLICY  # noqa: E402
from dear.tasks.synthetic import load_synthetic  # noqa: E402


@dataclass
class ClientResult:
    latency_s: float
    error: str | None = None
    server_s: float | None = None  # queued + debating, as the server measured it


@dataclass
class Summary:
    command: str
    seed: int
    server_command: str
    clients: int
    model: str
    max_active: int
    answered: int
    errors: int
    error_examples: list[str]
    wall_s: float
    latency_p50_s: float
    latency_p95_s: float
    latency_max_s: float
    server_p50_s: float | None
    requests_per_s: float
    scheduler: dict
    machine: dict = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, port: int, log_path: Path) -> tuple[subprocess.Popen, list[str]]:
    cmd = [sys.executable, "-m", "dear.serve", "--policy", str(args.policy), "--llm", "sim", "--port", str(port),
           "--max-active", str(args.max_active), "--max-queue", str(max(256, args.clients)),
           "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("DEAR_API_KEY", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc, cmd
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise TimeoutError(f"the server was not ready after {args.start_timeout} s:\n{log_path.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def run_clients(base_url: str, questions: Sequence[str], model: str, seed: int,
                      timeout_s: float) -> tuple[list[ClientResult], float]:
    """Every question from its own AsyncOpenAI client, all released together; (results, wall seconds)."""
    from openai import AsyncOpenAI

    clients = [AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=timeout_s)
               for _ in questions]
    go = asyncio.Event()

    async def one(k: int) -> ClientResult:
        await go.wait()
        t0 = time.perf_counter()
        try:
            r = await clients[k].chat.completions.create(
                model=model, messages=[{"role": "user", "content": questions[k]}], seed=seed + k)
            dear = r.model_extra["dear"]
            return ClientResult(time.perf_counter() - t0, server_s=dear["queued_s"] + dear["debate_s"])
        except Exception as e:  # counted, so one failure does not hide the others
            return ClientResult(time.perf_counter() - t0, error=f"{type(e).__name__}: {e}"[:300])

    tasks = [asyncio.create_task(one(k)) for k in range(len(questions))]
    await asyncio.sleep(0.5)  # every task is waiting at the gate
    t0 = time.perf_counter()
    go.set()
    results = await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    await asyncio.gather(*(c.close() for c in clients))
    return list(results), wall


def machine() -> dict:
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),  # the server inherits it (torch's encoder)
            "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"), "load_before": None,
            "load_after": None}


def summarize(results: list[ClientResult], wall: float, args: argparse.Namespace, command: str,
              server_command: str, scheduler: dict, host: dict) -> Summary:
    ok = [r for r in results if r.error is None]
    lat = sorted(r.latency_s for r in results)
    server = [r.server_s for r in ok if r.server_s is not None]
    return Summary(
        command=command, seed=args.seed, server_command=server_command, clients=args.clients, model=args.model,
        max_active=args.max_active, answered=len(ok), errors=len(results) - len(ok),
        error_examples=sorted({r.error for r in results if r.error})[:5], wall_s=round(wall, 2),
        latency_p50_s=round(statistics.median(lat), 2),
        latency_p95_s=round(statistics.quantiles(lat, n=20, method="inclusive")[18] if len(lat) > 1 else lat[0], 2),
        latency_max_s=round(lat[-1], 2),
        server_p50_s=round(statistics.median(server), 2) if server else None,
        requests_per_s=round(len(ok) / wall, 2), scheduler=scheduler, machine=host)


def scheduler_delta(before: dict, after: dict) -> dict:
    """The server's counters over the run (the maxima as they stand after it)."""
    keys = ("steps", "backend_calls", "debate_rounds", "debates_finished", "debates_failed")
    out = {k: after.get(k, 0) - before.get(k, 0) for k in keys}  # a server without a counter: 0
    out["mean_debates_per_step"] = round(out["debate_rounds"] / out["steps"], 2) if out["steps"] else 0.0
    out["max_debates_per_step"] = after["max_debates_per_step"]
    return out


def report(s: Summary) -> str:
    lines = [
        f"command: {s.command}",
        f"seed: {s.seed} (questions: load_synthetic(n={s.clients}, seed={s.seed}, split='test'); "
        f"request seeds {s.seed}..{s.seed + s.clients - 1})",
        f"server: {s.server_command}",
        f"[synthetic] {s.clients} concurrent AsyncOpenAI clients, model {s.model!r}, --max-active {s.max_active}: "
        f"{s.answered} answered, {s.errors} errors",
        f"latency p50 {s.latency_p50_s:.1f} s, p95 {s.latency_p95_s:.1f} s, max {s.latency_max_s:.1f} s "
        f"(queued + debating in the server, p50: {s.server_p50_s} s)",
        f"throughput {s.requests_per_s:.2f} requests/s ({s.answered} in {s.wall_s:.1f} s)",
        f"scheduler: {s.scheduler}",
        f"machine: {s.machine}",
    ]
    lines += [f"error: {e}" for e in s.error_examples]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python bench/bench_serve.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=200, help="concurrent AsyncOpenAI clients, one request each")
    p.add_argument("--max-active", type=int, default=32, help="the server's --max-active")
    p.add_argument("--model", default="dear", help="the method every client asks for (dear, mad, sc, ...)")
    p.add_argument("--policy", default=str(SHIPPED_POLICY), help="the server's --policy (default: the shipped one)")
    p.add_argument("--seed", type=int, default=0, help="question set and request seeds")
    p.add_argument("--timeout-s", type=float, default=600.0, help="each client's request timeout")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds to wait for the server to start")
    p.add_argument("--out", help="write summary.json into this directory")
    a = p.parse_args(argv)
    if a.clients < 1 or a.max_active < 1:
        p.error("--clients and --max-active must be >= 1")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join(["python", "bench/bench_serve.py", *(sys.argv[1:] if argv is None else argv)])
    questions = [q.question for q in load_synthetic(n=args.clients, seed=args.seed, split="test")]
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        proc, server_cmd = start_server(args, port, Path(tmp) / "server.log")
        try:
            base = f"http://127.0.0.1:{port}"
            before = httpx.get(f"{base}/health", timeout=30).json()["scheduler"]
            host = machine()
            host["load_before"] = [round(x, 2) for x in os.getloadavg()]
            results, wall = asyncio.run(run_clients(f"{base}/v1", questions, args.model, args.seed, args.timeout_s))
            host["load_after"] = [round(x, 2) for x in os.getloadavg()]
            after = httpx.get(f"{base}/health", timeout=30).json()["scheduler"]
        finally:
            stop_server(proc)
    shown = ["python", *server_cmd[1:]]
    shown[shown.index("--port") + 1] = "PORT"
    policy = Path(args.policy).resolve()
    if policy.is_relative_to(ROOT):
        shown[shown.index("--policy") + 1] = str(policy.relative_to(ROOT))
    server_command = shlex.join(shown)
    summary = summarize(results, wall, args, command, server_command, scheduler_delta(before, after), host)
    print(report(summary), flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "summary.json", asdict(summary), trailing_newline=True, indent=2)
        print(f"summary -> {out / 'summary.json'}")
    return 0 if summary.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
