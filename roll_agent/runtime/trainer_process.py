"""The local runtime's trainer in a child process (`runtime.trainer_process=true`).

Why: in one process the trainer's, the engine's and the env managers' Python share one
GIL; with a small model most of each step is Python and op dispatch, so the three take
turns instead of running side by side. A child process gives the trainer its own
interpreter; the controller drives it through `ProcessTrainer`: the `Trainer` contract
forwarded over a pipe (roll_agent/runtime/forward.py), and `named_weights`.

Weights: the child moves its synced parameters (all, or the LoRA adapters) into shared
memory once and hands them over; the optimizer updates them in place, so a weight sync
reads them with no copy between processes. The controller never syncs during a step
(one call at a time), so a sync never reads weights mid-update.

A child that dies fails the call waiting on it within a fraction of a second, with its
exit code (`TrainerProcessError`), whoever else holds the pipe (`peer_pipe.PeerPipe`
watches the process sentinel too); the child exits when its parent goes away.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import traceback

import torch
import torch.multiprocessing as mp

from roll_agent.config import Config
from roll_agent.protocols import Trainer
from roll_agent.runtime.forward import answer, forwards, state_of
from roll_agent.runtime.peer_pipe import PeerGone, PeerPipe

CLOSE_TIMEOUT_S = 10.0  # a child that does not answer `close` in this long is killed


class TrainerProcessError(RuntimeError):
    """The trainer raised in its process (the message carries its traceback), or the process died."""


@forwards(Trainer)
class ProcessTrainer:
    def __init__(self, cfg: Config, model_path: str, threads: int = 0):
        """`threads`: torch's intra-op threads in the child (0: torch's default)."""
        ctx = mp.get_context("spawn")  # never fork: the parent runs threads (engines, env pools)
        conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, cfg, model_path, threads), name="roll_agent-trainer",
                                 daemon=True)
        self._proc.start()
        child.close()
        self._pipe = PeerPipe(conn, self._proc.sentinel)
        self._lock = threading.Lock()
        try:
            state, self._weights = self._call("start")
            self.__dict__.update(state)
        except BaseException:
            self.close()
            raise

    def _forward(self, name: str, args: tuple, kwargs: dict):
        return self._call(name, args, kwargs)

    def _call(self, method: str, args: tuple = (), kwargs: dict | None = None, timeout: float | None = None):
        """Send one call and wait for its answer (`timeout`: None where the call has no bound,
        as a training step on a large model has none)."""
        with self._lock:
            try:
                self._pipe.send((method, args, kwargs or {}), timeout=timeout)
                ok, value = self._pipe.recv(timeout=timeout)
            except PeerGone:
                self._proc.join(timeout=5)
                raise TrainerProcessError(f"the trainer process died (exit code {self._proc.exitcode}) during "
                                          f"'{method}'; its error, if any, is in the log above") from None
            except TimeoutError as e:
                raise TrainerProcessError(f"the trainer process did not answer '{method}': {e}") from None
        if not ok:
            raise TrainerProcessError(f"the trainer failed in '{method}':\n{value}")
        return value

    def named_weights(self):
        """The child's parameters themselves (shared memory): read them only between calls."""
        return iter(self._weights)

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._call("close", timeout=CLOSE_TIMEOUT_S)
            except TrainerProcessError:
                pass
        self._pipe.close()
        self._proc.join(timeout=CLOSE_TIMEOUT_S)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()


def _serve(conn, cfg: Config, model_path: str, threads: int) -> None:
    """The child: build the trainer, then answer calls until `close` or the parent is gone."""
    from roll_agent.train.trainer import trainer_for_run

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which closes this process
    if threads:
        torch.set_num_threads(threads)
    pipe = PeerPipe(conn, multiprocessing.parent_process().sentinel)
    trainer = None
    while True:
        try:
            method, args, kwargs = pipe.recv()
        except PeerGone:  # the parent exited (or was killed)
            return
        try:
            if method == "start":
                trainer = trainer_for_run(cfg, model_path)
                weights = [(name, t.share_memory_()) for name, t in trainer.named_weights()]
                result = (state_of(trainer, Trainer), weights)
            elif method == "close":
                pipe.send((True, None))
                return
            else:
                result = answer(trainer, Trainer, method, args, kwargs)
        except Exception:  # the caller re-raises it; the process goes on serving
            result, ok = traceback.format_exc(), False
        else:
            ok = True
        try:
            pipe.send((ok, result))
        except PeerGone:
            return
