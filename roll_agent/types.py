"""The records passed between stages (docs/architecture.md, section 2)."""

from __future__ import annotations

import enum
import hashlib
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Callable


class Status(str, enum.Enum):
    """How an episode ended: every started episode ends as exactly one of these (counted by
    roll_agent/rollout/accounting.py). An episode's own run ends in one of the first four;
    the buffer and the scheduler decide the last two."""

    FINISHED = "finished"  # the env said terminated
    TRUNCATED = "truncated"  # turn / token limit reached, or env truncated
    CANCELLED = "cancelled"  # redundant episode of a completed group, stale group, engine gave up, restart
    ENV_ERROR = "env_error"  # env raised or timed out
    STALE_DROPPED = "stale_dropped"  # ended well but too old to train on when its batch came
    LOST = "lost"  # the process that ran it died (a Ray env worker; never under the local runtime)


_request_ids = itertools.count()
INFO_TEXT_LIMIT = 20_000  # characters kept of each string in Trajectory.info (a patch, a grading log)
_PROCESS = uuid.uuid4().hex[:8]  # request ids stay unique when many processes (Ray actors) share one proxy


def _head_and_tail(text: str, limit: int = INFO_TEXT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    cut = f"\n[... {len(text) - limit} characters left out ...]\n"
    return text[:limit // 2] + cut + text[-(limit // 2):]


def next_request_id(prefix: str = "req") -> str:
    return f"{prefix}-{_PROCESS}-{next(_request_ids)}"


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    stop_token_ids: tuple[int, ...] = ()
    top_logprobs: int = 0  # k > 0: each token's k likeliest alternatives too (same log-prob convention)


# what an engine (and the proxy) calls with each run of tokens as they are sampled: their ids,
# log-probs and, when asked, their top-k alternatives (one list of (token id, log-prob) per token)
TokenSink = Callable[[list[int], list[float], list[list[tuple[int, float]]] | None], None]


@dataclass
class GenerateRequest:
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    env_id: str = ""
    request_id: str = field(default_factory=next_request_id)
    # called with the answer's tokens as they are sampled (an engine that cannot stream: at the end
    # of its call), each once and in order: together they are the result's token_ids
    # (roll_agent/proxy/llm_proxy.py). It stays in the caller's process: a proxy in another one
    # (Ray) never calls it, and the caller has the answer when generate returns
    on_tokens: TokenSink | None = field(default=None, repr=False, compare=False)


@dataclass
class EngineOutput:
    """What one engine call produced; `finish_reason == "abort"` means partial output."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token, when sampling.top_logprobs > 0


@dataclass
class GenerateResult:
    """What the proxy returns to a caller: never an abort caused by a weight update."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]  # policy version that generated each token
    finish_reason: str  # "stop" | "length"
    request_id: str = ""
    num_reissues: int = 0
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token, when sampling.top_logprobs > 0


def state_key(observation, info: dict) -> str:
    """Which state a turn was played from: the env's `info["state_key"]` when it says, else a hash
    of the observation the model was shown. Turns of one group with equal keys are one anchor
    state for turn-level credit (roll_agent/train/algorithms.py: gigpo)."""
    if "state_key" in info:
        return str(info["state_key"])
    return hashlib.blake2b(str(observation).encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


@dataclass
class Turn:
    """One model call of an episode: where its sampled tokens lie, the state it was played from
    and the reward the env gave for it."""

    sample: int  # which of the episode's samples(): 0 the episode's own tokens, k its segments[k - 1]
    start: int  # the call's sampled tokens are that sample's token_ids[start:end]
    end: int
    state_key: str = ""
    reward: float = 0.0


@dataclass
class Trajectory:
    """One whole episode, token-in/token-out."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 only on model-generated tokens
    logprobs: list[float] = field(default_factory=list)  # behaviour log-probs (0 where mask 0)
    versions: list[int] = field(default_factory=list)  # policy version per token (-1 where mask 0)
    prompt_len: int = 0  # tokens of the first prompt
    reward: float = 0.0
    step_rewards: list[float] = field(default_factory=list)
    group_id: int = -1
    env_id: str = ""
    env_tag: str = ""
    seed: int = 0
    num_turns: int = 0
    status: Status = Status.FINISHED
    success: bool = False
    error: str = ""
    start_version: int = 0
    timing: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    # the env's last info, its plain values (a SWE episode's patch and grade), for the rollout
    # dumps (roll_agent/trajectory_dumps.py) and the env's episode report; strings capped at
    # INFO_TEXT_LIMIT characters (head and tail: a log's end says how it ended)
    info: dict = field(default_factory=dict)
    # an agent episode's further samples: when the agent's history stopped being a prefix of what
    # the model saw (roll_agent/agents/sessions.py), each new segment is trained as its own sample,
    # with this episode's reward and advantage
    segments: list[Trajectory] = field(default_factory=list)
    # the episode's model calls in the order they were made (on the episode, not on its segments):
    # turn-level estimators give each its own advantage (roll_agent/train/algorithms.py)
    turns: list[Turn] = field(default_factory=list)

    def keep_info(self, info: dict) -> None:
        self.info = {str(k): (_head_and_tail(v) if isinstance(v, str) else v) for k, v in info.items()
                     if isinstance(v, (str, int, float, bool)) or v is None}

    def samples(self) -> list[Trajectory]:
        """What is trained for this episode: itself and its further segments."""
        return [self, *self.segments]

    def append(self, ids: list[int], *, generated: bool, logprobs=None, versions=None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if generated else 0] * len(ids))
        self.logprobs.extend(logprobs if generated else [0.0] * len(ids))
        self.versions.extend(versions if generated else [-1] * len(ids))

    @property
    def min_version(self) -> int:
        """Oldest policy version among the generated tokens of every segment (start version if none yet)."""
        gen = [v for t in self.samples() for v in t.versions if v >= 0]
        return min(gen) if gen else self.start_version

    @property
    def num_generated_tokens(self) -> int:
        """Of this sample (its further segments count for themselves)."""
        return sum(self.loss_mask)


@dataclass
class Group:
    """Episodes of one task/seed, the unit GRPO-style advantages are computed over."""

    group_id: int
    seed: int
    env_tag: str
    trajectories: list[Trajectory]

    @property
    def min_version(self) -> int:
        return min(t.min_version for t in self.trajectories)
