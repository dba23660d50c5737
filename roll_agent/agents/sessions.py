"""One agent episode's calls, recorded token-exactly.

A chat request continues a segment (a sample of the episode so far) when its rendered text
begins with the segment's text (its prompts and the decoded samples), or else when its history
holds the answer the session returned last on that segment, after the same history it answered
(roll_agent/agents/token_reuse.py: recognised by its tool-call ids, else by its content and tool
calls up to whitespace, JSON spacing, special tokens and thinking). Then the segment's token ids
stand for everything up to and including that answer, exactly as the model saw and sampled
them, and only the messages after it are rendered with the chat template and tokenized (loss
mask 0). A /v1/completions prompt continues a segment its text (or its token ids) starts with.
Otherwise the call starts a new segment from the whole rendered prompt: a fork, counted by its
cause (`FORK_REASONS`). Each segment is trained as its own sample with exactly the tokens the
engine saw, sharing the episode's reward and group (`Trajectory.segments`).

The first segment is the episode's Trajectory itself; later ones are added to its `segments`.
A segment with a call in flight is not extended by a second concurrent call (that call forks),
so each segment's tokens stay one linear history.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from roll_agent.agents.token_reuse import Answer, Answers, text_after
from roll_agent.types import GenerateResult, Trajectory, Turn, state_key

# why a call started a new segment: the agent changed an earlier message or dropped the model's
# answers; its history holds an assistant message the session never returned; the segment it
# continues had a call in flight; the chat template did not render the rest around the answer
FORK_REASONS = ("history_edited", "unknown_assistant_message", "concurrent", "template_mismatch")


@dataclass
class Segment:
    traj: Trajectory
    text: str = ""  # what traj.token_ids stand for: the rendered prompt pieces and the decoded samples
    busy: bool = False


@dataclass
class Call:
    """One request in flight: the segment it extends and the prompt it sends."""

    segment: Segment
    new_ids: list[int]  # the tokens this request adds before the model's answer (loss mask 0)
    prompt_ids: list[int]  # everything the engine sees
    text: str  # the rendered prompt (its state key)
    seen: str  # the text prompt_ids stand for (the rendered prompt, unless earlier answers stand for themselves)
    history: int | None = None  # a chat request's fingerprint, that its answer is recognised after
    fork_reason: str = ""  # why it starts a new segment beside others
    answer: Answer | None = None  # what it returned, once finished


@dataclass
class Session:
    key: str
    env_id: str  # the proxy's env id: sticky routing and abort
    traj: Trajectory  # the episode: its first segment
    formatter: object  # the rollout's ChatFormatter: its encode() is the one tokenization path
    greedy: bool = False
    max_calls: int = 0  # 0: no limit
    segments: list[Segment] = field(default_factory=list)
    calls: int = 0
    extended: int = 0
    forked: int = 0
    retokenize_mismatches: int = 0  # calls whose history, tokenized afresh, differs from what the model saw
    fork_reasons: Counter = field(default_factory=Counter)  # forked calls by FORK_REASONS
    truncated: str = ""  # why a call was refused for a limit (the episode then ends truncated)
    closed: bool = False
    tasks: set[asyncio.Task] = field(default_factory=set)  # generate calls in flight
    _episode_free: bool = True  # the episode's Trajectory is not yet a segment
    answers: Answers = field(init=False)

    def __post_init__(self):
        added = getattr(self.formatter.tokenizer, "added_tokens_decoder", {}).values()
        self.answers = Answers([t.content for t in added if t.special])

    def _encode(self, text: str) -> list[int]:
        return self.formatter.encode(text)

    def _decode(self, ids: list[int]) -> str:
        return self.formatter.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def begin_chat(self, messages: list[dict], tools: list | None, text: str) -> Call:
        """A chat request (`text`: its messages rendered): continues a segment its text starts
        with, else the segment of the last answer of the session its history holds, else forks."""
        reading = self.answers.read(messages, tools)
        if (segment := self._text_continues(text)) is not None:
            return self._continue(segment, text[len(segment.text):], text, text, reading.history)
        answer, reason = reading.answer, reading.anomaly
        if answer is not None:
            segment = answer.segment
            if segment.busy:
                reason = "concurrent"
            elif len(segment.traj.token_ids) == answer.end:  # else the agent went back to an earlier point of it
                after = text_after(self.formatter.tokenizer, messages, tools, reading.index, answer.stop_text)
                if after is not None:
                    return self._continue(segment, after, text, segment.text + after, reading.history)
                reason = "template_mismatch"
        return self._fork(text, reason or "history_edited", reading.history)

    def begin_text(self, text: str) -> Call:
        """A text prompt (/v1/completions): continues the segment whose text it starts with (the latest such)."""
        if (segment := self._text_continues(text)) is not None:
            return self._continue(segment, text[len(segment.text):], text, text, None)
        return self._fork(text, "history_edited", None)

    def begin_ids(self, ids: list[int]) -> Call:
        """A prompt given as token ids (/v1/completions): continues a segment it starts with."""
        busy = False
        text = self._decode(ids)
        for segment in reversed(self.segments):
            n = len(segment.traj.token_ids)
            if n and ids[:n] == segment.traj.token_ids:
                if not segment.busy:
                    return self._begin(segment, list(ids[n:]), text, text, None)
                busy = True
        return self._begin(None, list(ids), text, text, None, "concurrent" if busy else "history_edited")

    def _text_continues(self, text: str) -> Segment | None:
        for segment in reversed(self.segments):
            if not segment.busy and segment.text and text.startswith(segment.text):
                return segment
        return None

    def _continue(self, segment: Segment, rest: str, text: str, seen: str, history: int | None) -> Call:
        """`segment` continued by the text `rest` (tokenized: loss mask 0)."""
        n = len(segment.traj.token_ids)
        if self._encode(text)[:n] != segment.traj.token_ids:
            self.retokenize_mismatches += 1
        return self._begin(segment, self._encode(rest), text, seen, history)

    def _fork(self, text: str, reason: str, history: int | None) -> Call:
        if any(s.busy and s.text and text.startswith(s.text) for s in self.segments):
            reason = "concurrent"
        return self._begin(None, self._encode(text), text, text, history, reason)

    def _begin(self, segment: Segment | None, new_ids: list[int], text: str, seen: str, history: int | None,
               fork_reason: str = "") -> Call:
        if segment is None:
            fresh = self._episode_free
            self._episode_free = False
            segment = Segment(self.traj if fresh else Trajectory(
                group_id=self.traj.group_id, env_id=self.traj.env_id, env_tag=self.traj.env_tag,
                seed=self.traj.seed, start_version=self.traj.start_version))
            if not self.segments:  # the first segment, unless one started beside it finishes first
                fork_reason = "concurrent"
        segment.busy = True
        return Call(segment, new_ids, segment.traj.token_ids + new_ids, text, seen, history, fork_reason)

    def finish(self, call: Call, result: GenerateResult) -> None:
        """Record what the model saw and sampled; the segment can be extended again."""
        segment = call.segment
        traj = segment.traj
        if not traj.token_ids:
            traj.prompt_len = len(call.new_ids)
        traj.append(call.new_ids, generated=False)
        start = len(traj.token_ids)
        traj.append(result.token_ids, generated=True, logprobs=result.logprobs, versions=result.versions)
        traj.num_turns += 1
        segment.text = call.seen + self._decode(result.token_ids)
        segment.busy = False
        if call.history is not None:  # a chat answer: recognised in later histories once returned
            last = result.token_ids[-1] if result.token_ids else None
            stop = self._decode([last]) if last in self.formatter.stop_token_ids else ""
            call.answer = self.answers.add(Answer(segment, len(traj.token_ids), call.history, stop))
        if segment in self.segments:
            self.extended += 1
        else:
            if self.segments:
                self.forked += 1
                self.fork_reasons[call.fork_reason] += 1
            self.segments.append(segment)
            if traj is not self.traj:
                self.traj.segments.append(traj)
        sample = next(k for k, s in enumerate(self.traj.samples()) if s is traj)
        # the state a call is played from: its whole rendered prompt (an agent's history is its state)
        self.traj.turns.append(Turn(sample, start, len(traj.token_ids), state_key(call.text, {})))
        self.calls += 1

    def answered(self, call: Call, content: str, tool_calls: list[dict]) -> None:
        """What the agent was sent for `call` (content, tool calls with their ids)."""
        if call.answer is not None:
            self.answers.returned(call.answer, content, tool_calls)

    def abandon(self, call: Call) -> None:
        """The call failed or was cancelled: nothing of it is recorded."""
        call.segment.busy = False
        if call.segment.traj is self.traj and not self.traj.token_ids:
            self._episode_free = True  # the episode's own trajectory is still unused

    def metrics(self) -> dict[str, float]:
        return {"agent_calls": float(self.calls), "agent_segments": float(len(self.segments)),
                "agent_extended": float(self.extended), "agent_forked": float(self.forked),
                "agent_retokenize_mismatches": float(self.retokenize_mismatches),
                **{f"agent_forked_{reason}": float(self.fork_reasons[reason]) for reason in FORK_REASONS}}

    def close(self) -> None:
        """The episode is over: later requests are refused, the ones in flight cancelled."""
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
