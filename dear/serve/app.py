"""The Starlette app: POST /v1/chat/completions, GET /v1/models, GET /health (run by uvicorn, see __main__).

The request's `model` picks the method (`dear.serve.methods`); a debate that a budget (`max_tokens`,
`dear_max_rounds`) stopped before its planned rounds ends with `finish_reason: "length"` and says which budget
in `dear.stopped`. A server started with agent profiles (`--agent-profiles`) names them in `dear.agent_profiles`
(one per agent of the method) and in each agent of `dear.rounds` (`profile`, `style`), and in /health.

Status codes: 400 bad request (malformed JSON, wrong types, no user message, unsupported parameter, a seed
out of range, a token budget below round 0's worst case, a question too long for the backend's context: code
`context_length_exceeded`), 401 missing or
wrong API key (when the server has one; `/health` needs none), 404 unknown model, 413 request body over
`max_body_size`, 429 queue full, 503 backend unavailable or failing (with the backend's error as the reason),
500 a bug. Errors use OpenAI's body, `{"error": {"message", "type", "param", "code"}}`, so the official
clients raise them with the message.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, AuthenticationError, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import dear
from dear.debate.profiles import names
from dear.infer import InferenceResult, make_question
from dear.synthetic_header import parse_header
from dear.serve.schemas import (
    DebateParams,
    RequestError,
    chunk_json,
    completion_json,
    parse_request,
    round_json,
    usage_json,
)
from dear.serve.methods import DEAR, served_names
from dear.serve.scheduler import (
    BudgetTooSmall,
    ContextTooLong,
    DebateDone,
    DebateFailed,
    DebateJob,
    DebateScheduler,
    Event,
    QueueFull,
    RoundDone,
    Unavailable,
    is_context_error,
)
from dear.tasks import KINDS

log = logging.getLogger(__name__)

FINGERPRINT = f"dear-{dear.__version__}"
DEFAULT_MAX_BODY_SIZE = 4 * 1024 * 1024  # bytes of one request body (4 MiB)
OPEN_PATHS = ("/health",)  # answered without the API key


@dataclass(frozen=True)
class ServeSettings:
    model_name: str = DEAR  # the `model` clients pass for DEAR (the baselines keep their names)
    default_kind: str = "numeric"  # answer kind when the request names none
    # When set, every path but OPEN_PATHS needs `Authorization: Bearer <api_key>` (never shown in the repr).
    api_key: str | None = field(default=None, repr=False)
    max_body_size: int = DEFAULT_MAX_BODY_SIZE  # larger request bodies get 413

    def __post_init__(self):
        served_names(self.model_name)  # a name the baselines use is refused here
        if self.max_body_size < 1:
            raise ValueError(f"max_body_size must be >= 1 byte, got {self.max_body_size}")
        if self.api_key is not None and (not self.api_key or self.api_key != self.api_key.strip()):
            raise ValueError("the API key must be non-empty, without leading or trailing whitespace")


def _error(status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _request_error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _unavailable(reason: str) -> JSONResponse:
    return _error(503, reason, "backend_unavailable", code="backend_unavailable", headers={"Retry-After": "5"})


def _context_exceeded(message: str) -> JSONResponse:
    return _error(400, message, "invalid_request_error", "messages", "context_length_exceeded")


def _debate_failed(error: str | None) -> JSONResponse:
    """A debate the backend failed: 400 when it refused the prompt as too long for its context (the request's
    fault), else 503 (the backend's)."""
    if is_context_error(error):
        return _context_exceeded(f"the backend refused the debate's prompt as too long for its context: {error}")
    return _unavailable(f"the backend failed during the debate: {error}")


_MAX_INT_DIGITS = 100  # JSON integers longer than this are refused before int() (its cost grows quadratically)


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (at most {_MAX_INT_DIGITS})")
    return int(text)


class _BodyTooLarge(Exception):
    def __init__(self, limit: int, size: int | None):
        self.limit, self.size = limit, size


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (_BodyTooLarge) as soon as it is known to exceed `limit` bytes: from its
    Content-Length before reading anything, else while it streams in (chunked uploads).

    Starlette >= 1.6 has `max_body_size`, but its 413 is plain text, not OpenAI's error body, and the serve
    extra supports Starlette from 0.40 (the GPU image's is pinned by vLLM's)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _BodyTooLarge(limit, int(declared))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge(limit, None)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(e: _BodyTooLarge) -> JSONResponse:
    size = f"{e.size} bytes" if e.size is not None else f"more than {e.limit} bytes"
    return _error(413, f"the request body is {size}; this server accepts at most {e.limit} bytes "
                       f"(--max-body-size)", "invalid_request_error", code="request_too_large",
                  headers={"Connection": "close"})


class _BearerKey(AuthenticationBackend):
    """`Authorization: Bearer <key>` on every path but OPEN_PATHS; keys compared in constant time (as SHA-256
    digests, so not even the length of the key shows in the timing)."""

    def __init__(self, key: str):
        self._digest = hashlib.sha256(key.encode()).digest()

    async def authenticate(self, conn: HTTPConnection):
        if conn.scope.get("path") in OPEN_PATHS:
            return None
        scheme, _, token = conn.headers.get("authorization", "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError("missing API key: this server needs the header "
                                      "'Authorization: Bearer <key>' (OpenAI clients send it from their api_key)")
        if not hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest):
            raise AuthenticationError("incorrect API key provided")
        return AuthCredentials(["authenticated"]), SimpleUser("client")


def _unauthorized(conn: HTTPConnection, e: AuthenticationError) -> Response:
    return _error(401, str(e), "invalid_request_error", code="invalid_api_key",
                  headers={"WWW-Authenticate": "Bearer"})


def _finish_reason(done: DebateDone) -> str:
    """"length" for a debate a budget cut short (OpenAI's word for a reply cut at max_tokens), else "stop"."""
    return "stop" if done.stopped is None else "length"


class _Listener:
    """Carries scheduler events (from its thread) into an asyncio queue of the request's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue[Event] = asyncio.Queue()

    def __call__(self, event: Event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


SYNTHETIC_TASK = "synthetic"
SYNTHETIC_ANSWERS = ("the synthetic debater backend ('sim') answers only questions of the 'synthetic' task, whose "
                     "text carries its '[synthetic id=... difficulty=... answer=... distractors=...]' header")


def synthetic_example() -> str:
    """A question the synthetic backend answers: the first test question of the synthetic task."""
    from dear.tasks.synthetic import load_synthetic

    return load_synthetic(n=1, seed=0, split="test")[0].question


def synthetic_refusal() -> str:
    """The 400 message for another question on the synthetic backend: what it answers, and an example header."""
    header = synthetic_example().splitlines()[0]
    return (f"this server runs the synthetic debater backend ('sim'), which only answers questions of the "
            f"'{SYNTHETIC_TASK}' task, with their '[synthetic ...]' header, e.g. '{header}' followed by the question "
            f"text (GET /v1/models says the same; a real model, e.g. --llm local, answers any question)")


class _Api:
    """The endpoints of one app: a scheduler, the settings, and the model names they serve."""

    def __init__(self, scheduler: DebateScheduler, settings: ServeSettings):
        self.scheduler, self.settings = scheduler, settings
        self.served = served_names(settings.model_name)  # model name -> method

    @asynccontextmanager
    async def lifespan(self, app: Starlette):
        self.scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(self.scheduler.close)

    async def health(self, request: Request) -> Response:
        scheduler = self.scheduler
        body: dict[str, Any] = {"status": "ok", "model": self.settings.model_name, "models": list(self.served),
                                **scheduler.load(),
                                "scheduler": scheduler.stats.to_dict()}
        debater = scheduler.debater
        if debater is not None:
            body["backend"] = {"model_id": debater.backend.model_id, "synthetic": debater.backend.synthetic,
                               "agent_profiles": names(debater.config.agent_profiles)}
            body["policy"] = {"path": str(debater.exported.path), "n_agents": debater.config.n_agents,
                              "n_rounds": debater.config.n_rounds, "trained_on_synthetic": debater.exported.synthetic}
        reason = scheduler.unavailable or scheduler.stats.last_backend_error
        if reason:
            body.update(status="unavailable", reason=reason)
            return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    async def models(self, request: Request) -> Response:
        ids = [n for name in self.served for n in (name, *(f"{name}:{k}" for k in KINDS))]
        # On the synthetic backend every model says which task it answers (extra fields; clients keep them).
        task = {"task": SYNTHETIC_TASK, "answers": SYNTHETIC_ANSWERS} if self.scheduler.synthetic else {}
        return JSONResponse({"object": "list", "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "dear", **task} for n in ids]})

    async def chat(self, request: Request) -> Response:
        body = await self._json_body(request)
        if isinstance(body, Response):
            return body
        admitted = await self._admit(body)
        if isinstance(admitted, Response):
            return admitted
        params, question, request_id = admitted
        listener = _Listener()
        job = DebateJob(question=question, seed=params.seed, notify=listener, method=params.method,
                        max_tokens=params.max_tokens, max_rounds=params.max_rounds)
        try:
            self.scheduler.submit(job)
        except QueueFull as e:
            return _error(429, str(e), "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
        except Unavailable as e:
            return _unavailable(str(e))
        if params.stream:
            return await self._stream(job, listener, params, request_id)
        return await self._complete(job, listener, params, request_id)

    async def _json_body(self, request: Request) -> Any:
        """The request's JSON body, or the error response (413, 400) that refuses it."""
        try:
            return json.loads(await _read_body(request, self.settings.max_body_size), parse_int=_parse_int)
        except _BodyTooLarge as e:
            return _too_large(e)
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, _parse_int's
            return _error(400, f"malformed JSON in the request body: {e}", "invalid_request_error")
        except RecursionError:
            return _error(400, "malformed JSON in the request body: nested too deeply", "invalid_request_error")

    async def _admit(self, body: Any) -> tuple[DebateParams, Any, str] | Response:
        """The request's parameters, its question and id, checked against the method's budget and the backend's
        context before any agent runs; or the 400 response that refuses it."""
        scheduler = self.scheduler
        try:
            params = parse_request(body, self.served, self.settings.default_kind)
            scheduler.check_budget(params.method, params.max_tokens)
            if scheduler.synthetic and parse_header(params.question) is None:
                raise RequestError(synthetic_refusal(), "messages")
            request_id = f"chatcmpl-dear-{uuid.uuid4().hex[:24]}"
            question = make_question(params.question, params.kind, params.choices, qid=request_id)  # type: ignore[arg-type]
        except RequestError as e:
            return _request_error(e)
        except BudgetTooSmall as e:
            return _error(400, str(e), "invalid_request_error", params.budget_param, "budget_too_small")
        except ValueError as e:
            return _error(400, str(e), "invalid_request_error")
        try:  # before any agent runs (the tokenizer may be an HTTP call: off the event loop)
            await asyncio.to_thread(scheduler.check_context, question, params.method, params.max_rounds)
        except ContextTooLong as e:
            return _context_exceeded(str(e))
        return params, question, request_id

    async def _complete(self, job: DebateJob, listener: _Listener, params: DebateParams,
                        request_id: str) -> Response:
        rounds: list[dict[str, Any]] = []
        try:
            while True:
                event = await listener.events.get()
                if isinstance(event, RoundDone):
                    rounds.append(round_json(event.turns, event.control, params.include_texts))
                elif isinstance(event, DebateFailed):
                    return _error(event.status, event.reason,
                                  "backend_unavailable" if event.status == 503 else "server_error")
                else:
                    return self._finished(event, rounds, params, request_id)
        finally:
            job.cancelled = True  # no-op once finished; drops the debate if the client went away

    def _finished(self, done: DebateDone, rounds: list[dict[str, Any]], params: DebateParams,
                  request_id: str) -> Response:
        r = done.result
        if r.failed:
            return _debate_failed(r.error)
        dear_body = self._dear_summary(r, params, done) | {"rounds": rounds}
        return JSONResponse(completion_json(request_id, params.model, r.answer or "", dear_body,
                                            usage_json(r.prompt_tokens, r.completion_tokens), FINGERPRINT,
                                            _finish_reason(done)))

    def _dear_summary(self, r: InferenceResult, params: DebateParams, done: DebateDone) -> dict[str, Any]:
        debater, method = self.scheduler.debater, self.scheduler.methods.get(params.method)
        return {
            "answer": r.answer, "tie": r.tie, "votes": dict(r.trace.vote_counts), "kind": params.kind,
            "method": params.method, "debate_id": r.trace.debate_id, "seed": r.trace.seed,
            "n_agents": r.trace.n_agents, "n_rounds": len(r.answers_per_round) - 1,
            "stopped": done.stopped,
            "budget": {"max_tokens": params.max_tokens, "max_rounds": params.max_rounds},
            "backend": debater.backend.model_id if debater else None,
            # Each agent's profile (--agent-profiles): which pool answered; None for the server's uniform agents.
            "agent_profiles": method.agent_profiles if method else None,
            "synthetic": bool(debater and debater.backend.synthetic),
            # Only DEAR runs the policy; the baselines have none.
            "policy_trained_on_synthetic": (bool(debater and debater.exported.synthetic)
                                            if params.method == DEAR else None),
            "ignored_parameters": list(params.ignored),
            "queued_s": round(done.queued_s, 4), "debate_s": round(done.debate_s, 4),
        }

    async def _stream(self, job: DebateJob, listener: _Listener, params: DebateParams,
                      request_id: str) -> Response:
        # Wait for round 0 before answering, so a backend that is down still gets a 503 status.
        first = await listener.events.get()
        if isinstance(first, DebateFailed):
            job.cancelled = True
            return _error(first.status, first.reason, "backend_unavailable" if first.status == 503 else "server_error")
        if isinstance(first, DebateDone) and first.result.failed:
            return _debate_failed(first.result.error)
        return StreamingResponse(self._sse(job, listener, first, params, request_id), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _sse(self, job: DebateJob, listener: _Listener, first: Event, params: DebateParams,
                   request_id: str) -> AsyncIterator[str]:
        def chunk(delta, finish=None, dear_part=None, usage=None) -> str:
            return _sse_line(chunk_json(request_id, params.model, FINGERPRINT, delta, finish, dear_part, usage))

        try:
            yield chunk({"role": "assistant", "content": ""})
            event = first
            while True:
                if isinstance(event, RoundDone):
                    yield chunk({}, dear_part={"round": round_json(event.turns, event.control,
                                                                   params.include_texts)})
                elif isinstance(event, DebateFailed):
                    yield _sse_line({"error": {"message": event.reason, "type": "backend_unavailable",
                                               "code": event.status}})
                    break
                else:
                    r = event.result
                    if r.failed:
                        yield _sse_line(_failed_event(r.error))
                        break
                    yield chunk({"content": r.answer or ""})
                    yield chunk({}, _finish_reason(event), dear_part=self._dear_summary(r, params, event))
                    if params.include_usage:
                        yield chunk(None, usage=usage_json(r.prompt_tokens, r.completion_tokens))
                    break
                event = await listener.events.get()
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled = True


def _sse_line(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _failed_event(error: str | None) -> dict[str, Any]:
    """The stream's error event of a debate the backend failed (the body `_debate_failed` would answer)."""
    if is_context_error(error):
        return json.loads(_debate_failed(error).body)
    return {"error": {"message": f"the backend failed during the debate: {error}", "type": "backend_unavailable",
                      "code": 503}}


def create_app(scheduler: DebateScheduler, settings: ServeSettings = ServeSettings()) -> Starlette:
    """The ASGI app around a scheduler (started on startup, closed on shutdown)."""
    api = _Api(scheduler, settings)
    routes = [Route("/v1/chat/completions", api.chat, methods=["POST"]),
              Route("/v1/models", api.models, methods=["GET"]), Route("/health", api.health, methods=["GET"])]
    middleware = [] if settings.api_key is None else [
        Middleware(AuthenticationMiddleware, backend=_BearerKey(settings.api_key), on_error=_unauthorized)]
    app = Starlette(routes=routes, lifespan=api.lifespan, middleware=middleware)
    app.state.started = time.time()
    return app
