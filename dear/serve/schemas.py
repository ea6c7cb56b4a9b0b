"""The OpenAI chat-completions request as the DEAR server reads it: types checked strictly, parameters sorted
into used / ignored / rejected, and the response and stream-chunk bodies built from a finished debate.

Which request fields do what (also in `docs/SERVING.md`):

- used: `model` (the method: a served name from `dear.serve.methods`, optionally `NAME:KIND` to pick the
  answer kind), `messages` (the last `user` message is the question), `stream`,
  `stream_options.include_usage`, `seed` (the debate's seed, from which every agent's sampling seed derives;
  0 ... 2**63-1), `n` (only 1), `max_tokens` or `max_completion_tokens` (the debate's completion tokens over
  all agents and rounds), and the extensions `dear_kind`, `dear_choices` (option texts for kind `choice`),
  `dear_texts` (include every agent's full text), `dear_max_rounds` (at most this many exchange rounds);
- ignored, and listed back in `dear.ignored_parameters`: every other field, among them `temperature`,
  `top_p` and `stop` (the policy chooses each agent's sampling from round 1 on; round 0's sampling and the
  per-turn token limit are server settings), `user`, `metadata`;
- rejected with 400: `n` > 1, `tools` / `functions` / a `tool_choice` other than "none", a `response_format`
  other than text, `logprobs: true`, and non-text content parts in the question.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dear.debate.trace import AgentTurn
from dear.regulator import RegulatorRecord
from dear.tasks import KINDS

MAX_SEED = 2**63 - 1  # request seeds: 0 ... MAX_SEED (a non-negative signed 64-bit integer)

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class RequestError(ValueError):
    """A request the server refuses: HTTP status, message and the offending parameter (OpenAI error body)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class ContentPart(_Strict):
    type: str
    text: str | None = None


class MessageIn(_Strict):
    role: Role
    content: str | list[ContentPart] | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(_Strict):
    """The fields the server reads or type-checks; anything else is kept in `model_extra` and ignored."""

    model: str
    messages: list[MessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    n: int | None = None
    # The debate's completion-token budget (max_completion_tokens is OpenAI's newer name).
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # Accepted and ignored, but still type-checked so a client bug shows up as a 400.
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    # Rejected when set to something the server cannot honour.
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # DEAR extensions.
    dear_kind: str | None = None
    dear_choices: list[str] | None = None
    dear_texts: bool = False
    dear_max_rounds: int | None = Field(default=None, ge=0)


_IGNORED_KNOWN = ("temperature", "top_p", "stop", "user")


@dataclass(frozen=True)
class DebateParams:
    """What one chat request asks the debate scheduler for."""

    question: str
    kind: str
    choices: tuple[str, ...] | None
    seed: int | None
    stream: bool
    include_usage: bool
    include_texts: bool
    model: str  # echoed back as the response's model
    method: str  # the debate method the model names (dear.serve.methods)
    ignored: tuple[str, ...]  # request fields accepted but not used
    max_tokens: int | None = None  # completion-token budget of the whole debate
    budget_param: str | None = None  # the field that set it (max_tokens or max_completion_tokens)
    max_rounds: int | None = None  # exchange rounds at most


def validation_message(err: ValidationError) -> tuple[str, str | None]:
    """The first pydantic error as '<dotted field>: <what is wrong>' and the field path."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or "body"
    if e["type"] == "missing":
        return f"missing required parameter '{loc}'", loc
    got = e.get("input")
    shown = "" if isinstance(got, (dict, list)) else f" (got {type(got).__name__} {got!r})"
    return f"'{loc}': {e['msg']}{shown}", loc


def _text_of(message: MessageIn, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for k, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise RequestError(f"messages.{index}.content.{k}: only text content parts are supported "
                               f"(got type {part.type!r})", f"messages.{index}.content")
        texts.append(part.text)
    return "\n".join(texts)


def _check_rejected(req: ChatCompletionRequest) -> None:
    if req.n not in (None, 1):
        raise RequestError(f"'n': only n=1 is supported (one debate per request), got {req.n}", "n")
    if req.tools or req.functions:
        raise RequestError("tools/functions are not supported: a debate answers with text", "tools")
    if req.tool_choice not in (None, "none"):
        raise RequestError("'tool_choice': only 'none' is supported", "tool_choice")
    if req.response_format is not None and req.response_format.get("type", "text") != "text":
        raise RequestError("'response_format': only {\"type\": \"text\"} is supported", "response_format")
    if req.logprobs or req.top_logprobs:
        raise RequestError("'logprobs': not supported (the answer is a vote over several agents)", "logprobs")


def _resolve_method(req: ChatCompletionRequest, served: Mapping[str, str]) -> str:
    """The method `model` names (`NAME` or `NAME:KIND`); 404 model_not_found listing the served names."""
    name = req.model.partition(":")[0]
    if name not in served:
        raise RequestError(f"model {req.model!r} does not exist; this server serves {', '.join(served)} "
                           f"(each also as NAME:KIND with KIND in {', '.join(KINDS)})", "model",
                           status=404, code="model_not_found")
    return served[name]


def _resolve_kind(req: ChatCompletionRequest, default_kind: str) -> str:
    """The answer kind from `dear_kind` or a `MODEL:KIND` name."""
    suffix = req.model.partition(":")[2]
    for value, param in ((suffix, "model"), (req.dear_kind, "dear_kind")):
        if value and value not in KINDS:
            raise RequestError(f"'{param}': unknown answer kind {value!r}; known: {', '.join(KINDS)}", param)
    if suffix and req.dear_kind and suffix != req.dear_kind:
        raise RequestError(f"answer kind given twice and differently: model suffix {suffix!r}, "
                           f"dear_kind {req.dear_kind!r}", "dear_kind")
    return req.dear_kind or suffix or default_kind


def _token_budget(req: ChatCompletionRequest) -> tuple[int | None, str | None]:
    """The debate's completion-token budget and the field that set it; both fields must agree."""
    given = [(v, k) for k, v in (("max_completion_tokens", req.max_completion_tokens),
                                 ("max_tokens", req.max_tokens)) if v is not None]
    if len({v for v, _ in given}) > 1:
        raise RequestError(f"'max_tokens' ({req.max_tokens}) and 'max_completion_tokens' "
                           f"({req.max_completion_tokens}) disagree; send one of them", "max_completion_tokens")
    return given[0] if given else (None, None)


def parse_request(body: Any, served: Mapping[str, str], default_kind: str) -> DebateParams:
    """Validate a decoded JSON body; `served` maps model names to methods. Raises RequestError (400/404)
    naming the offending parameter."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        message, param = validation_message(e)
        raise RequestError(message, param) from None
    _check_rejected(req)
    method = _resolve_method(req, served)
    kind = _resolve_kind(req, default_kind)
    max_tokens, budget_param = _token_budget(req)
    users = [k for k, m in enumerate(req.messages) if m.role == "user"]
    if not users:
        raise RequestError("'messages': no message with role 'user' (the last user message is the question)",
                           "messages")
    question = _text_of(req.messages[users[-1]], users[-1]).strip()
    if not question:
        raise RequestError(f"messages.{users[-1]}.content: the question (last user message) is empty",
                           f"messages.{users[-1]}.content")
    if kind == "choice" and not req.dear_choices:
        raise RequestError("answer kind 'choice' needs the option texts in 'dear_choices'", "dear_choices")
    if req.dear_choices and kind != "choice":
        raise RequestError(f"'dear_choices' needs answer kind 'choice', got {kind!r}", "dear_choices")
    ignored = sorted({k for k in _IGNORED_KNOWN if getattr(req, k) is not None} | set(req.model_extra or {}))
    return DebateParams(
        question=question, kind=kind, choices=tuple(req.dear_choices) if req.dear_choices else None,
        seed=req.seed, stream=req.stream,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        include_texts=req.dear_texts, model=req.model, method=method, ignored=tuple(ignored),
        max_tokens=max_tokens, budget_param=budget_param, max_rounds=req.dear_max_rounds)


# ---------------------------------------------------------------------------------------------------
# Response bodies


def round_json(turns: list[AgentTurn], control: RegulatorRecord | None, include_texts: bool) -> dict[str, Any]:
    """One debate round: every agent's answer and sampling (and, with agent profiles, its profile and reply style),
    and (from round 1) the regulator's decision."""
    agents = []
    for t in turns:
        a = {"agent": t.agent, "answer": t.answer, "key": t.answer_key, "peers": list(t.peers),
             "temperature": t.temperature, "top_p": t.top_p, "prompt_tokens": t.prompt_tokens,
             "completion_tokens": t.completion_tokens, "finish_reason": t.finish_reason}
        if t.profile is not None:  # only with profiles, as in the traces
            a.update(profile=t.profile, style=t.style)
        if include_texts:
            a["text"] = t.text
        agents.append(a)
    out: dict[str, Any] = {"round": turns[0].round if turns else None, "agents": agents}
    if control is not None:
        out["regulator"] = {"mask": control.mask, "temperature": control.temperature, "top_p": control.top_p,
                            "belief": control.b, "uncertainty": control.u}
    return out


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_json(request_id: str, model: str, content: str, dear: dict[str, Any],
                    usage: dict[str, int], fingerprint: str, finish_reason: str = "stop") -> dict[str, Any]:
    return {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "system_fingerprint": fingerprint,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": finish_reason, "logprobs": None}],
            "usage": usage, "dear": dear}


def chunk_json(request_id: str, model: str, fingerprint: str, delta: dict[str, Any] | None,
               finish_reason: str | None = None, dear: dict[str, Any] | None = None,
               usage: dict[str, int] | None = None) -> dict[str, Any]:
    """One `chat.completion.chunk`; delta None gives the usage-only chunk (empty choices) of include_usage."""
    out: dict[str, Any] = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()),
                           "model": model, "system_fingerprint": fingerprint,
                           "choices": [] if delta is None else [
                               {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}
    if dear is not None:
        out["dear"] = dear
    if usage is not None:
        out["usage"] = usage
    return out
