"""An answer streamed as the engine samples it (`stream: true`): its text, as far as stop strings
and tool calls have decided it, in OpenAI's chunks.

`Decoding` turns the tokens as they arrive into the text `ChatFormatter.response_text` gives for
them all (stop and special tokens dropped), a window at a time as vLLM's detokenizer does: text
waits while its last token ends inside a character. `stop_decided` holds back a tail that may
begin a stop string, and cuts at one once no other could cut earlier. `ChatStream` and
`CompletionStream` turn that text into chunks; their `end` takes the answer as the non-streamed
path gives it and sends what is left of it, so what a client accumulates is that answer.
"""

from __future__ import annotations

import bisect
import time
import uuid

from roll_agent.agents.openai_api import HERMES, legacy_logprobs, parse_hermes, split_hermes


class Decoding:
    """An answer's tokens as they arrive, and its text so far."""

    def __init__(self, formatter):
        self.formatter = formatter
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.top: list = []  # per token: its alternatives, or None
        self.text = ""
        self.ends: list[int] = []  # where each token's text ends in `text` (tokens whose text is out)
        self._start = self._read = 0  # ids[_start:_read] were decoded last; ids[_read:] are not out yet

    def add(self, ids: list[int], logprobs: list[float], top: list | None = None) -> None:
        self.ids += ids
        self.logprobs += logprobs
        self.top += top or [None] * len(ids)
        decode = self.formatter.response_text
        before, after = decode(self.ids[self._start:self._read]), decode(self.ids[self._start:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before):]
            self._start, self._read = self._read, len(self.ids)
            self.ends += [len(self.text)] * (self._read - len(self.ends))

    def shown(self, upto: int) -> int:
        """How many tokens' text lies within text[:upto]."""
        return bisect.bisect_right(self.ends, upto)


def stop_decided(text: str, stops: list[str]) -> tuple[int, bool]:
    """How much of `text`, an answer so far, the agent may see whatever comes next, and whether a
    stop string ended it there."""
    hit = min((i for i in (text.find(s) for s in stops) if i >= 0), default=None)
    tail = _open_tail(text, stops)
    if hit is not None and hit <= tail:  # no stop string can still begin before it
        return hit, True
    return tail, False


def hermes_settled(text: str) -> int:
    """How much of `text` parse_hermes reads the same whatever the model writes next: all but an
    unclosed `<tool_call>` block or a tail that may begin one."""
    end = max((m.end() for m in HERMES.finditer(text)), default=0)
    start = text.find("<tool_call>", end)
    return start if start >= 0 else _open_tail(text, ["<tool_call>"], end)


def _open_tail(text: str, marks: list[str], start: int = 0) -> int:
    """Where the longest tail of `text[start:]` that may begin one of `marks` starts (len(text): none)."""
    for p in range(max(start, len(text) - max(map(len, marks), default=0) + 1), len(text)):
        if any(len(m) > len(text) - p and m.startswith(text[p:]) for m in marks):
            return p
    return len(text)


class _Stream:
    """The chunks' frame; log-prob entries ride on the next chunk sent."""

    object = ""
    empty: dict = {}  # the delta of a chunk that only closes the answer

    def __init__(self, model: str, prefix: str):
        self.base = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": self.object, "created": int(time.time()),
                     "model": model}
        self.released = 0  # how much of the text the deltas so far show
        self._entries: list[dict] = []

    def chunks(self, deltas: list[dict], entries: list[dict]) -> list[dict]:
        self._entries += entries
        out = [self._chunk(delta) for delta in deltas]
        if out and self._entries:
            out[0]["choices"][0]["logprobs"], self._entries = self._logprobs(self._entries), []
        return out

    def last(self, finish: str, usage: dict | None) -> list[dict]:
        """The finish reason (with the entries no chunk carried yet) and, when asked for, the usage
        in a chunk of no choices."""
        final = self._chunk(self.empty, finish)
        if self._entries:
            final["choices"][0]["logprobs"] = self._logprobs(self._entries)
        return [final] + ([{**self.base, "choices": [], "usage": usage}] if usage is not None else [])

    def _chunk(self, delta: dict, finish: str | None = None) -> dict:
        choice = {"index": 0, **self._choice(delta), "finish_reason": finish, "logprobs": None}
        return {**self.base, "choices": [choice]}

    def _choice(self, delta: dict) -> dict:
        raise NotImplementedError

    def _logprobs(self, entries: list[dict]) -> dict:
        raise NotImplementedError


class ChatStream(_Stream):
    """A chat answer: content as it is decided. With the hermes parser, a `<tool_call>` block is
    sent once it closes: a delta with its index, id, type and name, then one with its arguments;
    trailing whitespace waits (an answer with tool calls ends without it). A user's parser reads
    the whole answer, so then everything comes at the end."""

    object = "chat.completion.chunk"

    def __init__(self, model: str, parse=None):
        super().__init__(model, "chatcmpl")
        self.parse = parse  # the tool parser, when the answer's tool calls are parsed
        self.content = ""
        self.calls: list[dict] = []

    def start(self) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def update(self, text: str) -> list[dict]:
        """The deltas `text` (the answer so far, as the agent may see it) decides."""
        if self.parse is None:
            content, calls = text, []
        elif self.parse is parse_hermes:
            text = text[:hermes_settled(text)].rstrip()
            content, calls = split_hermes(text)
            content = content.rstrip()
        else:
            return []
        self.released = len(text)
        return self._deltas(content, calls)

    def end(self, content: str, calls: list[dict]) -> tuple[list[dict], list[dict]]:
        """The deltas left of the answer (`content`, `calls` as the non-streamed path returns them),
        and its tool calls with the ids they were streamed with."""
        calls = self.calls + calls[len(self.calls):]
        return self._deltas(content, calls), calls

    def _deltas(self, content: str, calls: list[dict]) -> list[dict]:
        deltas = []
        if len(content) > len(self.content):
            deltas.append({"content": content[len(self.content):]})
            self.content = content
        for i, call in enumerate(calls[len(self.calls):], start=len(self.calls)):
            function = call["function"]
            deltas += [{"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                        "function": {"name": function["name"], "arguments": ""}}]},
                       {"tool_calls": [{"index": i, "function": {"arguments": function["arguments"]}}]}]
        self.calls = self.calls + calls[len(self.calls):]
        return deltas

    def _choice(self, delta: dict) -> dict:
        return {"delta": delta}

    def _logprobs(self, entries: list[dict]) -> dict:
        return {"content": entries}


class CompletionStream(_Stream):
    """A /v1/completions answer: its text as it is decided, after the prompt when it is echoed."""

    object = "text_completion"
    empty = {"text": ""}

    def __init__(self, model: str, echo: str = "", alternatives: bool = False):
        super().__init__(model, "cmpl")
        self.echo = echo
        self.alternatives = alternatives
        self.text = ""

    def start(self) -> list[dict]:
        return [self._chunk({"text": self.echo})] if self.echo else []

    def update(self, text: str) -> list[dict]:
        self.released = len(text)
        return self.end(text)

    def end(self, text: str) -> list[dict]:
        """The delta of what `text` adds to the text sent."""
        if len(text) <= len(self.text):
            return []
        delta, self.text = text[len(self.text):], text
        return [{"text": delta}]

    def _choice(self, delta: dict) -> dict:
        return delta

    def _logprobs(self, entries: list[dict]) -> dict:
        return legacy_logprobs(entries, self.alternatives)
