"""One agent episode's calls, recorded token-exactly.

Every request is rendered with the tokenizer's chat template. When that text begins with the
text of a segment recorded so far (the earlier prompt plus what the model actually sampled for
it), the call extends that segment: its token ids are reused as they are, and only the text
after them is tokenized (the new user / tool turns, loss mask 0). Otherwise (the agent edited,
dropped or summarised its history, or renders the model's answer differently from what it
sampled) the call starts a new segment from the whole rendered prompt. Each segment is trained
as its own sample with exactly the tokens the engine saw, sharing the episode's reward and
group (`Trajectory.segments`).

The first segment is the episode's Trajectory itself; later ones are added to its `segments`.
A segment with a call in flight is not extended by a second concurrent call (that call forks),
so each segment's tokens stay one linear history.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from roll_agent.types import GenerateResult, Trajectory, Turn, state_key


@dataclass
class Segment:
    traj: Trajectory
    text: str = ""  # what traj.token_ids stand for: the rendered prompts and the decoded samples
    busy: bool = False


@dataclass
class Call:
    """One request in flight: the segment it extends and the prompt it sends."""

    segment: Segment
    new_ids: list[int]  # the tokens this request adds before the model's answer (loss mask 0)
    prompt_ids: list[int]  # everything the engine sees
    text: str  # the rendered prompt


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
    truncated: str = ""  # why a call was refused for a limit (the episode then ends truncated)
    closed: bool = False
    tasks: set[asyncio.Task] = field(default_factory=set)  # generate calls in flight
    _episode_free: bool = True  # the episode's Trajectory is not yet a segment

    def _encode(self, text: str) -> list[int]:
        return self.formatter.encode(text)

    def _decode(self, ids: list[int]) -> str:
        return self.formatter.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def begin_text(self, text: str) -> Call:
        """The segment whose text this prompt extends (the latest such), else a new one."""
        for segment in reversed(self.segments):
            if not segment.busy and segment.text and text.startswith(segment.text):
                new_ids = self._encode(text[len(segment.text):])
                whole = self._encode(text)
                if whole[:len(segment.traj.token_ids)] != segment.traj.token_ids:
                    self.retokenize_mismatches += 1
                return self._begin(segment, new_ids, text)
        return self._begin(None, self._encode(text), text)

    def begin_ids(self, ids: list[int]) -> Call:
        """A prompt given as token ids (/v1/completions): extends a segment it starts with."""
        for segment in reversed(self.segments):
            n = len(segment.traj.token_ids)
            if not segment.busy and n and ids[:n] == segment.traj.token_ids:
                return self._begin(segment, list(ids[n:]), self._decode(ids))
        return self._begin(None, list(ids), self._decode(ids))

    def _begin(self, segment: Segment | None, new_ids: list[int], text: str) -> Call:
        if segment is None:
            fresh = self._episode_free
            self._episode_free = False
            segment = Segment(self.traj if fresh else Trajectory(
                group_id=self.traj.group_id, env_id=self.traj.env_id, env_tag=self.traj.env_tag,
                seed=self.traj.seed, start_version=self.traj.start_version))
        segment.busy = True
        return Call(segment, new_ids, segment.traj.token_ids + new_ids, text)

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
        segment.text = call.text + self._decode(result.token_ids)
        segment.busy = False
        if segment in self.segments:
            self.extended += 1
        else:
            self.forked += bool(self.segments)
            self.segments.append(segment)
            if traj is not self.traj:
                self.traj.segments.append(traj)
        sample = next(k for k, s in enumerate(self.traj.samples()) if s is traj)
        # the state a call is played from: its whole rendered prompt (an agent's history is its state)
        self.traj.turns.append(Turn(sample, start, len(traj.token_ids), state_key(call.text, {})))
        self.calls += 1

    def abandon(self, call: Call) -> None:
        """The call failed or was cancelled: nothing of it is recorded."""
        call.segment.busy = False
        if call.segment.traj is self.traj and not self.traj.token_ids:
            self._episode_free = True  # the episode's own trajectory is still unused

    def metrics(self) -> dict[str, float]:
        return {"agent_calls": float(self.calls), "agent_segments": float(len(self.segments)),
                "agent_extended": float(self.extended), "agent_forked": float(self.forked),
                "agent_retokenize_mismatches": float(self.retokenize_mismatches)}

    def close(self) -> None:
        """The episode is over: later requests are refused, the ones in flight cancelled."""
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
