"""Watchdog: every wait that could hang (an env stage, an engine request, the trainer's
wait for a batch) runs inside `watch(kind, what, timeout)`. Past its threshold the wait
is cancelled, logged with what it was waiting on (env id, request id, stage) and counted;
the caller gets `Stuck` (a TimeoutError) and decides what cancelling means there (the
episode ends as env_error, the request is re-issued elsewhere, ...). Waits that are long
but not yet over their limit are logged every `report_after_s`, oldest first, so a run
never sits silent (from the first wait on).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
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
        self._closed = False

    def watch(self, kind: str, what: str, timeout: float | None) -> "_Watch":
        """`async with watch(...)`: run the body; past `timeout` seconds (None or 0: no limit) cancel
        it and raise Stuck. (A small class, not a generator: it sits on every env step and request.)"""
        return _Watch(self, kind, what, timeout)

    def oldest(self, n: int = 10) -> list[str]:
        now = time.monotonic()
        waits = sorted(self.waits.values(), key=lambda w: w.since)[:n]
        return [f"{w.kind} for {now - w.since:.1f}s: {w.what}" for w in waits]

    def _start(self) -> None:
        """Start logging long waits, at the first wait (the one that may grow long)."""
        if self._reporter is None and self.cfg.report_after_s and not self._closed:
            self._reporter = asyncio.get_running_loop().create_task(self._report(), name="watchdog")

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.report_after_s)
            cutoff = time.monotonic() - self.cfg.report_after_s
            old = [w for w in self.waits.values() if w.since < cutoff]
            if old:
                log.warning("watchdog: %d waits older than %.0fs; oldest: %s", len(old), self.cfg.report_after_s,
                            "; ".join(self.oldest(5)))

    def _stuck(self, kind: str, what: str, timeout: float) -> Stuck:
        self.stats[f"stuck_{kind}"] += 1
        log.warning("watchdog: %s stuck for %.1fs waiting on %s: cancelled", kind, timeout, what)
        return Stuck(f"{kind} stuck for {timeout:.1f}s waiting on {what}")

    def metrics(self) -> dict[str, int]:
        return {f"watchdog_{k}": v for k, v in sorted(self.stats.items())}

    async def close(self) -> None:
        self._closed = True
        if self._reporter is not None:
            self._reporter.cancel()
            await asyncio.gather(self._reporter, return_exceptions=True)
            self._reporter = None


class _Watch:
    __slots__ = ("dog", "kind", "what", "timeout", "key", "limit")

    def __init__(self, dog: Watchdog, kind: str, what: str, timeout: float | None):
        self.dog, self.kind, self.what, self.timeout = dog, kind, what, timeout
        self.limit: asyncio.Timeout | None = None

    async def __aenter__(self) -> None:
        if self.dog._reporter is None:
            self.dog._start()
        self.key = next(self.dog._ids)
        self.dog.waits[self.key] = Wait(self.kind, self.what, time.monotonic())
        if self.timeout:
            self.limit = asyncio.timeout(self.timeout)
            await self.limit.__aenter__()

    async def __aexit__(self, exc_type, exc, tb) -> bool | None:
        del self.dog.waits[self.key]
        if self.limit is None:
            return None
        try:
            return await self.limit.__aexit__(exc_type, exc, tb)
        except TimeoutError as timeout_exc:
            if not self.limit.expired():
                raise  # an inner timeout: not ours to report
            raise self.dog._stuck(self.kind, self.what, self.timeout) from timeout_exc
