"""Episode accounting: every episode that starts ends as exactly one outcome.

Outcomes: `finished` / `truncated` (trained on: counted when its group is consumed
by a training step), `cancelled` (redundant, stale group, engine gave up, or cut off
by a restart), `env_error` (the env raised or timed out), `stale_dropped` (ended
well but too old to train on) and `lost` (the process that ran it died: a Ray env
worker; never under the local runtime). Until then an episode is *in flight*: running, or
ended well and waiting in a lane or the buffer.

The ledger only counts; `check` compares the counts with what the live structures
hold (running tasks, waiting trajectories), so a leak or a double count shows.
"""

from __future__ import annotations

from collections import Counter

OUTCOMES = ("finished", "truncated", "cancelled", "env_error", "stale_dropped", "lost")


class EpisodeLedger:
    def __init__(self):
        self.counts: Counter = Counter()

    def start(self, n: int = 1) -> None:
        self.counts["started"] += n

    def end(self, outcome: str, n: int = 1) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown episode outcome {outcome!r}; one of {OUTCOMES}")
        self.counts[outcome] += n

    @property
    def ended(self) -> int:
        return sum(self.counts[o] for o in OUTCOMES)

    def check(self, in_flight: int) -> dict:
        """Cumulative counters plus the identity `started == sum(outcomes) + in_flight`."""
        row = {f"episodes_total_{k}": self.counts[k] for k in ("started", *OUTCOMES)}
        row["episodes_in_flight"] = in_flight
        row["accounting_ok"] = self.counts["started"] == self.ended + in_flight
        return row

    def state_dict(self, in_flight: int) -> dict:
        """Episodes in flight at a checkpoint never end in the resumed run: they count as cancelled."""
        counts = Counter(self.counts)
        counts["cancelled"] += in_flight
        return dict(counts)

    def load_state_dict(self, state: dict) -> None:
        self.counts = Counter(state)
