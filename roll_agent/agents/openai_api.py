"""The OpenAI API's request and response shapes as the endpoint serves them, and the parsers that
turn a model's text into OpenAI `tool_calls`.

Requests are validated with pydantic; a field of the wrong type or value is a 400 naming the
field. Fields the endpoint does not use (`user`, `metadata`, `frequency_penalty`, ...) are
accepted and ignored, as an agent written for OpenAI sends them. Messages are normalised into
what a transformers chat template reads: `developer` becomes `system`, content parts are joined
into one string, and an assistant's tool-call `arguments` (a JSON string in the API) become the
dict that chat templates render (transformers' tool-use convention), so a conversation the
endpoint answered renders back to the text the model produced.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator


class APIError(Exception):
    """An OpenAI-style error: HTTP status, message, type, the offending field (`param`) and a code."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCall(_Lenient):
    name: str
    arguments: Union[str, dict] = "{}"


class ToolCall(_Lenient):
    id: str = ""
    type: str = "function"
    function: FunctionCall


class Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[dict], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None


class _Sampling(_Lenient):
    model: str = ""
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    max_tokens: Optional[int] = Field(None, gt=0)
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = None
    n: int = Field(1, ge=1, le=1, description="the endpoint samples one choice per request")
    stream: bool = False
    stream_options: Optional[dict] = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    tools: Optional[list[dict]] = None
    tool_choice: Union[str, dict, None] = None
    max_completion_tokens: Optional[int] = Field(None, gt=0)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)

    @field_validator("top_logprobs")
    @classmethod
    def _with_logprobs(cls, value, info):
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    @property
    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens

    @property
    def with_logprobs(self) -> bool:
        return bool(self.logprobs)

    @property
    def alternatives(self) -> int:
        """How many likeliest tokens to give beside each sampled one."""
        return self.top_logprobs or 0

    def template_messages(self) -> list[dict]:
        return [_template_message(m) for m in self.messages]

    def template_tools(self) -> list[dict] | None:
        return self.tools or None


class CompletionRequest(_Sampling):
    # token ids are integers, never floats or strings (a 400 naming the field); their range is
    # the tokenizer's, checked by the endpoint that knows it
    prompt: Union[str, list[StrictInt]]
    logprobs: Optional[int] = Field(None, ge=0, le=5)
    echo: bool = False

    @property
    def token_limit(self) -> Optional[int]:
        return self.max_tokens

    @property
    def with_logprobs(self) -> bool:
        return self.logprobs is not None

    @property
    def alternatives(self) -> int:
        return self.logprobs or 0


def parse(model: type[BaseModel], body: bytes) -> Any:
    """A validated request, or an APIError(400) naming the first bad field."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # JSON nested thousands deep: the parser's stack runs out
        raise APIError(400, "The request body is nested too deeply to parse.") from exc
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except RecursionError as exc:
        raise APIError(400, "The request body is nested too deeply to validate.") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise APIError(400, f"Invalid value for '{where}': {first['msg']} (got {_short(first.get('input'))}).",
                       param=where) from exc


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _text(content: Union[str, list[dict], None]) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") not in ("text", "input_text", "output_text"):
            raise APIError(400, f"Content parts of type {part.get('type')!r} are not supported (text only).",
                           param="messages.content")
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _template_message(m: Message) -> dict:
    role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
    out: dict[str, Any] = {"role": role, "content": _text(m.content)}
    if m.name and role == "tool":
        out["name"] = m.name
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                             for c in m.tool_calls]
    return out


def _arguments(arguments: Union[str, dict]) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments  # not JSON: rendered as the agent sent it


# ---- tool-call parsers: model text -> (content, tool calls) ------------------------------

HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_hermes(text: str) -> tuple[str, list[dict]]:
    """Hermes / Qwen convention: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
    after the content. A block that is not a JSON call stays in the content (the agent sees
    what the model wrote)."""
    content, calls = split_hermes(text)
    return (content.rstrip() if calls else content), calls


def split_hermes(text: str) -> tuple[str, list[dict]]:
    """parse_hermes before it strips the content's trailing whitespace (an answer with calls ends without it)."""
    calls, pieces, last = [], [], 0
    for match in HERMES.finditer(text):
        try:
            call = json.loads(match.group(1))
            name, arguments = call["name"], call.get("arguments", {})
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        if not isinstance(name, str):
            continue
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name, "arguments": arguments if isinstance(arguments, str)
                                   else json.dumps(arguments, ensure_ascii=False)}})
        pieces.append(text[last:match.start()])
        last = match.end()
    pieces.append(text[last:])  # text between or after the calls (rare) is kept: nothing the model wrote is lost
    return "".join(pieces), calls


# ---- responses -----------------------------------------------------------------------------


def chat_response(model: str, content: str, tool_calls: list[dict], finish: str, usage: dict,
                  logprobs: list[dict] | None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not tool_calls else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish,
                              "logprobs": {"content": logprobs} if logprobs is not None else None}
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage}


def completion_response(model: str, text: str, finish: str, usage: dict, logprobs: dict | None) -> dict:
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}],
            "usage": usage}


def legacy_logprobs(entries: list[dict], alternatives: bool) -> dict:
    """/v1/completions' log-probs (the legacy shape) from chat-style entries: `top_logprobs` one
    {token: log-prob} dict per token when alternatives were asked for."""
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries]
            if alternatives else None, "text_offset": None}
