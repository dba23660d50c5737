"""Message-level token reuse: the model's own answers stand for themselves in an agent's history.

An agent sends its whole history with every call, the model's earlier answers in it as
assistant messages. Rendering those with the chat template rarely gives back the tokens the
model sampled: agents drop the newline before a tool call, re-serialise JSON arguments, lose a
special token, write tool calls as text of their own (smolagents: "Calling tools: [...]"), and
templates re-render old turns (Qwen3 drops earlier thinking). So a session remembers every
answer it returned (`Answer`: where its sampled ids end in their segment, the content and tool
calls it sent) and recognises it in a later request's history by its tool-call ids (as
`tool_calls`, or written in the content), else by its content and tool calls up to what agents
normalise (surrounding whitespace, re-serialised JSON, dropped special tokens or thinking).
An answer is recognised only after the history it was given after (the tools and every earlier
message, as the agent sent them), so a dropped, edited or summarised history is not mistaken
for a continuation. The request then continues the answer's segment: its ids stand for
everything up to and including the answer, and only the messages after it are rendered
(`text_after`) and tokenized.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_STAND_IN = "\x00ANSWER\x00"  # a recognised answer's place when the messages after it are rendered


@dataclass
class Answer:
    """An answer the session returned."""

    segment: object  # the sessions.Segment its sampled ids are in
    end: int  # where they end there
    history: int  # fingerprint of the tools and messages it answered
    stop_text: str  # the text of the stop token it ended with ("": it ran out of tokens)
    call_ids: tuple[str, ...] = ()
    key: tuple | None = None  # its content and tool calls, normalised; None until returned to the agent


@dataclass
class Reading:
    """What a chat request's history holds of the session's answers."""

    history: int  # fingerprint of the whole request: what its own answer will be recognised after
    index: int = -1  # the last message recognised as an answer
    answer: Answer | None = None
    # the first assistant message after it that is not recognised: "history_edited" (an answer
    # after another history than the one it answered), "unknown_assistant_message" (never returned)
    anomaly: str = ""


class Answers:
    """The answers of one session, found by the history they answered."""

    def __init__(self, special_tokens=()):
        self.specials = [s for s in special_tokens if s]
        self._by_history: dict[int, list[Answer]] = {}
        self._by_call_id: dict[str, Answer] = {}
        self._keys: set[tuple] = set()

    def add(self, answer: Answer) -> Answer:
        self._by_history.setdefault(answer.history, []).append(answer)
        return answer

    def returned(self, answer: Answer, content: str, tool_calls: list[dict]) -> None:
        """What the agent was sent for `answer`: how it will be recognised."""
        answer.call_ids = tuple(c["id"] for c in tool_calls if isinstance(c.get("id"), str) and c["id"])
        answer.key = (self._content(content), _calls(tool_calls))
        self._keys.add(answer.key)
        self._by_call_id.update((i, answer) for i in answer.call_ids)

    def read(self, messages: list[dict], tools: list | None) -> Reading:
        h = hash(("tools", json.dumps(tools, sort_keys=True, ensure_ascii=False) if tools else ""))
        reading = Reading(history=0)
        for i, message in enumerate(messages):
            role = message["role"]
            key = (self._content(message.get("content") or "", role == "assistant"), _calls(message.get("tool_calls")))
            if role == "assistant":
                found = next((a for a in reversed(self._by_history.get(h, ())) if self._is(message, key, a)), None)
                if found is not None:
                    reading.index, reading.answer, reading.anomaly = i, found, ""
                elif not reading.anomaly:
                    reading.anomaly = "history_edited" if self._returned(message, key) else "unknown_assistant_message"
            h = hash((h, role, key))
        reading.history = h
        return reading

    @staticmethod
    def _is(message: dict, key: tuple, answer: Answer) -> bool:
        if answer.key is None:
            return False
        if answer.call_ids:  # by its tool-call ids, as tool calls or written in the text (smolagents)
            ids = tuple(c.get("id") or "" for c in message.get("tool_calls") or ())
            content = message.get("content") or ""
            if ids == answer.call_ids or all(i in content for i in answer.call_ids):
                return True
        return key == answer.key

    def _returned(self, message: dict, key: tuple) -> bool:
        """Whether `message` is an answer the session returned, whatever its history."""
        content = message.get("content") or ""
        return (any(c.get("id") in self._by_call_id for c in message.get("tool_calls") or ())
                or any(i in content for i in self._by_call_id) or key in self._keys)

    def _content(self, text: str, answer: bool = True) -> str:
        """Content as compared: without special tokens, surrounding whitespace and, in an answer,
        its thinking (what templates drop of old turns and some clients strip)."""
        for special in self.specials:
            if special in text:
                text = text.replace(special, "")
        if answer and "</think>" in text:
            text = text.rsplit("</think>", 1)[1]
        return text.strip()


def _calls(tool_calls: list[dict] | None) -> tuple:
    functions = [c.get("function") or {} for c in tool_calls or ()]
    return tuple((f.get("name"), _canonical(f.get("arguments"))) for f in functions)


def _canonical(arguments) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def text_after(tokenizer, messages: list[dict], tools: list | None, index: int, stop_text: str) -> str | None:
    """The chat template's text after the answer at `messages[index]` (the messages after it and
    the generation prompt), less the stop token the answer's sampled ids already end with; None
    when the template does not render an assistant message's content once as it is."""
    stand_in = [*messages[:index], {"role": "assistant", "content": _STAND_IN}, *messages[index + 1:]]
    try:
        text = tokenizer.apply_chat_template(stand_in, tools=tools, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001  the template rejects the stand-in: no reuse, the call forks
        return None
    if text.count(_STAND_IN) != 1:
        return None
    after = text.split(_STAND_IN, 1)[1]
    return after[len(stop_text):] if stop_text and after.startswith(stop_text) else after
