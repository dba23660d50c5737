"""Episode accounting: every episode that starts ends as exactly one `Status`.

`finished` / `truncated` are counted when the episode's group is trained on (until then it
waits in a lane or the buffer), the others when they happen (see `roll_agent/types.py`).
Until it ends an episode is *in flight*: running, or ended well and waiting.

The ledger counts, and for the episodes that end with a reason (an env's or agent's error, a
timeout, a dead env worker) it counts them by outcome and reason class (`env_error/ValueError`)
and keeps the first reason of each class whole: the controller logs it once and writes the counts
to metrics.jsonl (`episodes_reason/...`). `RolloutStats` is what a rollout reports to the controller at
one moment; its `accounting()` compares the counts with what the live structures hold
(running tasks, waiting trajectories), so a leak or a double count shows.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from roll_agent.types import Status

OUTCOMES = tuple(s.value for s in Status)
PROXY_FAULTS = ("request_failures", "engine_crashes")  # the proxy counters a training step reports
MAX_REASON_CLASSES = 50  # distinct "<outcome>/<class>" kept; later new ones count as "<outcome>/other"
MAX_REASON_CHARS = 4000  # of a reason kept as its class's example (its head and tail)
_EXCEPTION_NAME = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Died))\b")


def reason_class(reason: str) -> str:
    """What a failure counts as: `timeout` (a watchdog, a step or an agent limit), the name of the
    exception it names (`ValueError`), `exit_<code>` (an agent command), else `other`."""
    first = reason.strip().split("\n", 1)[0]
    if any(s in first for s in ("stuck for", "timed out", "did not finish within")):
        return "timeout"
    if m := _EXCEPTION_NAME.search(first):
        return m.group(1)
    if m := re.search(r"exited with code (-?\d+)", first):
        return f"exit_{m.group(1)}"
    return "other"


class EpisodeLedger:
    def __init__(self):
        self.counts: Counter = Counter()  # "started" and each Status value
        self.reasons: Counter = Counter()  # "<outcome>/<reason class>" -> episodes that ended so
        self.examples: dict[str, str] = {}  # "<outcome>/<reason class>" -> the first such reason

    def start(self, n: int = 1) -> None:
        self.counts["started"] += n

    def end(self, outcome: Status, n: int = 1, reason: str = "") -> None:
        """`reason`: why, when it is a failure (the error with its traceback's tail, the limit hit)."""
        status = Status(outcome).value  # rejects an unknown outcome
        self.counts[status] += n
        if reason:
            key = f"{status}/{reason_class(reason)}"
            if key not in self.reasons and len(self.reasons) >= MAX_REASON_CLASSES:
                key = f"{status}/other"
            self.reasons[key] += n
            if key not in self.examples:
                self.examples[key] = reason if len(reason) <= MAX_REASON_CHARS else \
                    f"{reason[:MAX_REASON_CHARS // 4]}\n[...]\n{reason[-MAX_REASON_CHARS * 3 // 4:]}"

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
    reasons: dict[str, int] = field(default_factory=dict)  # "<outcome>/<reason class>" -> episodes
    reason_examples: dict[str, str] = field(default_factory=dict)  # the first reason of each
    groups_put: int = 0  # groups completed (into the buffer)

    @classmethod
    def of(cls, ledger, in_flight: int, proxy_stats: dict, watchdog: dict,
           env_worker_restarts: int = 0, agent_http: dict | None = None, groups_put: int = 0) -> "RolloutStats":
        """From a ledger (its counts, reasons and examples) and an LLMProxy's `stats` dict (either runtime's)."""
        return cls(dict(ledger.counts), in_flight, proxy_stats["gen_tokens"], {k: proxy_stats[k] for k in PROXY_FAULTS},
                   watchdog, env_worker_restarts, dict(agent_http or {}), dict(ledger.reasons), dict(ledger.examples),
                   groups_put)

    def accounting(self) -> dict:
        """Cumulative outcome counters and the identity `started == sum(outcomes) + in_flight`."""
        row = {f"episodes_total_{k}": self.episodes.get(k, 0) for k in ("started", *OUTCOMES)}
        row["episodes_in_flight"] = self.in_flight
        ended = sum(self.episodes.get(k, 0) for k in OUTCOMES)
        row["accounting_ok"] = self.episodes.get("started", 0) == ended + self.in_flight
        return row
