"""Watchdog: every wait that could hang (an env stage, an engine request, the trainer's
wait for a batch) runs inside `watch(kind, what, timeout)`. Past its threshold the wait
is cancelled, logged with what it was waiting on (env id, request id, stage) and counted;
the caller gets `Stuck` (a TimeoutError) and decides what cancelling means there (the
episode ends as env_error, the request is re-issued elsewhere, ...). Waits that are long
but not yet over their limit are logged every `report_after_s`, oldest first, so a run
never sits silent (once `start()` is called).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass

from roll_agent.config import WatchdogConfig

log = logging.getLogger(__name__)


class Stuck(TimeoutError):
    """A watched wait passed its threshold and was cancelled."""


@dataclass
class Wait:
    kind: str
    what: str
    since: float


class Watchdog:
    def __init__(self, cfg: WatchdogConfig | None = None):
        self.cfg = cfg or WatchdogConfig()
        self.waits: dict[int, Wait] = {}
        self.stats: Counter = Counter()  # stuck_<kind>: waits cancelled past their threshold
        self._ids = itertools.count()
        self._reporter: asyncio.Task | None = None

    @asynccontextmanager
    async def watch(self, kind: str, what: str, timeout: float | None):
        """Run the body; past `timeout` seconds (None or 0: no limit) cancel it and raise Stuck."""
        key = next(self._ids)
        self.waits[key] = Wait(kind, what, time.monotonic())
        try:
            if not timeout:
                yield
                return
            limit = asyncio.timeout(timeout)
            try:
                async with limit:
                    yield
            except TimeoutError as exc:
                if not limit.expired():
                    raise  # an inner timeout: not ours to report
                self.stats[f"stuck_{kind}"] += 1
                log.warning("watchdog: %s stuck for %.1fs waiting on %s: cancelled", kind, timeout, what)
                raise Stuck(f"{kind} stuck for {timeout:.1f}s waiting on {what}") from exc
        finally:
            del self.waits[key]

    def oldest(self, n: int = 10) -> list[str]:
        now = time.monotonic()
        waits = sorted(self.waits.values(), key=lambda w: w.since)[:n]
        return [f"{w.kind} for {now - w.since:.1f}s: {w.what}" for w in waits]

    def start(self) -> None:
        """Start logging long waits (idempotent; needs a running loop)."""
        if self._reporter is None and self.cfg.report_after_s:
            self._reporter = asyncio.get_running_loop().create_task(self._report(), name="watchdog")

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.report_after_s)
            cutoff = time.monotonic() - self.cfg.report_after_s
            old = [w for w in self.waits.values() if w.since < cutoff]
            if old:
                log.warning("watchdog: %d waits older than %.0fs; oldest: %s", len(old), self.cfg.report_after_s,
                            "; ".join(self.oldest(5)))

    def metrics(self) -> dict[str, int]:
        return {f"watchdog_{k}": v for k, v in sorted(self.stats.items())}

    async def close(self) -> None:
        if self._reporter is not None:
            self._reporter.cancel()
            await asyncio.gather(self._reporter, return_exceptions=True)
            self._reporter = None
