"""An asyncio event loop on a virtual clock: when nothing is ready to run, the clock jumps to
the next timer instead of sleeping. Code that waits with `asyncio.sleep`, `asyncio.timeout` or
`loop.call_later` (the simulated env's step latency, the scripted engine's, a simulated trainer)
runs hours of its time in seconds; real work (Python, tokenizing) takes no virtual time at all.

While a thread started with `run_in_executor` is busy (an env being made), the clock stands
still and the loop waits for it for real, so no timer fires early.

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        runner.run(main())          # inside: asyncio.get_running_loop().time() is virtual
"""

from __future__ import annotations

import asyncio
import selectors


class _Selector(selectors.DefaultSelector):
    def __init__(self):
        super().__init__()
        self.loop: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None):
        events = super().select(0)  # I/O that is ready now (a thread's wake-up, a pipe) goes first
        if events or timeout == 0:
            return events
        if timeout is None:  # no timer at all: only real I/O or a thread can wake the loop
            return super().select(None)
        if self.loop.threads:  # a thread is working: wait for it, the clock stands still
            return super().select(min(timeout, 0.05))
        self.loop.now += timeout  # nothing can happen before the next timer: jump to it
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self):
        self.now = 0.0
        self.threads = 0  # run_in_executor calls not yet done
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self.now

    def run_in_executor(self, executor, func, *args):
        future = super().run_in_executor(executor, func, *args)
        self.threads += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _future) -> None:
        self.threads -= 1
