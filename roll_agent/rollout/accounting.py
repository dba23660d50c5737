"""Episode accounting: every episode that starts ends as exactly one `Status`.

`finished` / `truncated` are counted when the episode's group is trained on (until then it
waits in a lane or the buffer), the others when they happen (see `roll_agent/types.py`).
Until it ends an episode is *in flight*: running, or ended well and waiting.

The ledger only counts. `RolloutStats` is what a rollout reports to the controller at
one moment; its `accounting()` compares the counts with what the live structures hold
(running tasks, waiting trajectories), so a leak or a double count shows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from roll_agent.types import Status

OUTCOMES = tuple(s.value for s in Status)
PROXY_FAULTS = ("request_failures", "engine_crashes")  # the proxy counters a training step reports


class EpisodeLedger:
    def __init__(self):
        self.counts: Counter = Counter()  # "started" and each Status value

    def start(self, n: int = 1) -> None:
        self.counts["started"] += n

    def end(self, outcome: Status, n: int = 1) -> None:
        self.counts[Status(outcome).value] += n  # Status(...) rejects an unknown outcome

    def state_dict(self, in_flight: int) -> dict:
        """Episodes in flight at a checkpoint never end in the resumed run: they count as cancelled."""
        counts = Counter(self.counts)
        counts[Status.CANCELLED.value] += in_flight
        return dict(counts)

    def load_state_dict(self, state: dict) -> None:
        self.counts = Counter(state)


@dataclass
class RolloutStats:
    """The rollout's cumulative counters at one moment, whichever runtime runs it."""

    episodes: dict[str, int]  # "started" and each Status value
    in_flight: int  # started, not yet ended: running, or ended well and waiting
    gen_tokens: int = 0  # sampled by the engines through the proxy
    proxy_faults: dict[str, int] = field(default_factory=dict)  # request_failures, engine_crashes
    watchdog: dict[str, int] = field(default_factory=dict)  # watchdog_* counters
    env_worker_restarts: int = 0  # env worker processes restarted after dying (rollout/env_workers.py)
    agent_http: dict[str, int] = field(default_factory=dict)  # the agent endpoints' error answers, by class

    @classmethod
    def of(cls, episodes: dict, in_flight: int, proxy_stats: dict, watchdog: dict,
           env_worker_restarts: int = 0, agent_http: dict | None = None) -> "RolloutStats":
        """From a ledger's counts and an LLMProxy's `stats` dict (either runtime's)."""
        return cls(dict(episodes), in_flight, proxy_stats["gen_tokens"], {k: proxy_stats[k] for k in PROXY_FAULTS},
                   watchdog, env_worker_restarts, dict(agent_http or {}))

    def accounting(self) -> dict:
        """Cumulative outcome counters and the identity `started == sum(outcomes) + in_flight`."""
        row = {f"episodes_total_{k}": self.episodes.get(k, 0) for k in ("started", *OUTCOMES)}
        row["episodes_in_flight"] = self.in_flight
        ended = sum(self.episodes.get(k, 0) for k in OUTCOMES)
        row["accounting_ok"] = self.episodes.get("started", 0) == ended + self.in_flight
        return row
