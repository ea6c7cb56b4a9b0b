"""A stand-in OpenAI-compatible chat server that simulates per-token decode latency (no model, no CPU burn).

    python bench/latency_server.py --port 8100 --ms-per-token 2 --tokens 64

Each `POST /v1/chat/completions` sleeps (asyncio, so requests overlap freely like on a GPU server with
continuous batching) `ms_per_token x completion tokens` and answers with a debate-formatted completion
("Reasoning: ... Conclusion: ... Final answer: \\boxed{X}"), X picked from `--answers` by a hash of the prompt
and seed, so agents disagree sometimes and debates have something to regulate. `usage` reports the prompt
as characters / 4 and the completion length. `GET /v1/models` lists the model; `GET /stats` tells how many
requests came and the most that were in flight at once (`POST /stats/reset` zeroes the counts). Used by
bench/bench_scaling.py and tests/dear/serve/test_serve.py.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

WORDS = ("first", "compute", "the", "total", "then", "subtract", "carry", "check", "units", "so", "we", "get")


def build_app(ms_per_token: float, tokens: int, answers: list[str], model: str = "latency-sim") -> Starlette:
    state = {"requests": 0, "in_flight": 0, "max_in_flight": 0, "completion_tokens": 0}

    def completion_text(prompt: str, seed: object, n_tokens: int) -> str:
        digest = hashlib.sha256(f"{prompt}|{seed}".encode()).digest()
        answer = answers[digest[0] % len(answers)]
        tail = f"\nConclusion: The answer is {answer}.\nFinal answer: \\boxed{{{answer}}}"
        n_words = max(1, n_tokens - 16)  # ~16 tokens for the conclusion and the boxed answer
        reasoning = " ".join(WORDS[(digest[1] + k) % len(WORDS)] for k in range(n_words))
        return f"Reasoning: {reasoning}{tail}"

    async def chat(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        n_tokens = max(1, min(int(body.get("max_tokens") or tokens), tokens))
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        state["requests"] += 1
        state["in_flight"] += 1
        state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        try:
            await asyncio.sleep(ms_per_token * n_tokens / 1000)
        finally:
            state["in_flight"] -= 1
        state["completion_tokens"] += n_tokens
        return JSONResponse({
            "id": f"cmpl-{state['requests']}", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant",
                                     "content": completion_text(prompt, body.get("seed"), n_tokens)}}],
            "usage": {"prompt_tokens": max(1, len(prompt) // 4), "completion_tokens": n_tokens,
                      "total_tokens": max(1, len(prompt) // 4) + n_tokens}})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "bench"}]})

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(dict(state))

    async def reset(request: Request) -> JSONResponse:
        state.update(requests=0, max_in_flight=state["in_flight"], completion_tokens=0)
        return JSONResponse(dict(state))

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/models", models), Route("/stats", stats),
                             Route("/stats/reset", reset, methods=["POST"])])


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(prog="python bench/latency_server.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--ms-per-token", type=float, default=2.0, help="simulated decode time per completion token")
    p.add_argument("--tokens", type=int, default=64, help="completion tokens per request (capped by max_tokens)")
    p.add_argument("--answers", default="42,42,41", help="comma-separated answers the agents pick from")
    a = p.parse_args(argv)
    app = build_app(a.ms_per_token, a.tokens, a.answers.split(","))
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
