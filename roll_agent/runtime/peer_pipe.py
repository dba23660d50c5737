"""One end of a pipe between a parent and a child process that notices when the other side dies.

A plain `Connection.recv()` returns only when the pipe's other end is closed by every
process holding it. A process forked (not spawned) while the pipe existed holds a copy
of that end, so a dead child's pipe can stay open and a waiting parent blocks forever.
`PeerPipe` waits on the pipe and the peer's process sentinel together: when the peer is
gone, the waiting `send`/`recv` raise `PeerGone` within one poll, whoever else holds
the pipe. Used by both sides: the parent watches its child's `Process.sentinel`, the child
watches `multiprocessing.parent_process().sentinel`.
"""

from __future__ import annotations

import threading
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler

# A message this small fits in an empty pipe's kernel buffer (a socketpair holds ~200 KB),
# so writing it never blocks; a larger one is written from a helper thread while this one
# watches the peer (a write into a pipe nobody reads would block forever).
_DIRECT_SEND_BYTES = 64 << 10
_POLL_S = 0.1


class PeerGone(ConnectionError):
    """The process at the other end of the pipe exited (or the pipe closed)."""


class PeerPipe:
    def __init__(self, conn: Connection, peer_sentinel: int):
        self.conn = conn
        self.sentinel = peer_sentinel

    def _peer_alive(self) -> bool:
        return not wait([self.sentinel], timeout=0)

    def send(self, obj, timeout: float | None = None) -> None:
        """Pickle `obj` (torch's reductions included: tensors in shared memory travel as handles)
        and write it. PeerGone if the peer exits first, TimeoutError after `timeout` seconds."""
        data = bytes(ForkingPickler.dumps(obj))
        if not self._peer_alive():
            raise PeerGone("the other process has exited")
        if len(data) <= _DIRECT_SEND_BYTES:
            self._write(data)
            return
        failure: list[BaseException] = []

        def write() -> None:
            try:
                self._write(data)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                failure.append(e)

        writer = threading.Thread(target=write, name="peer-pipe-send", daemon=True)
        writer.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while writer.is_alive():
            writer.join(_POLL_S)
            if writer.is_alive() and not self._peer_alive():
                raise PeerGone("the other process exited while a message was being sent")
            if deadline is not None and time.monotonic() > deadline and writer.is_alive():
                raise TimeoutError(f"the other process read nothing for {timeout:.0f}s")
        if failure:
            raise failure[0]

    def _write(self, data: bytes) -> None:
        try:
            self.conn.send_bytes(data)
        except (BrokenPipeError, ConnectionResetError, OSError) as e:
            raise PeerGone(f"the pipe closed while sending ({type(e).__name__})") from None

    def recv(self, timeout: float | None = None):
        """The next message. PeerGone if the peer exits without sending one (or the pipe
        closes), TimeoutError if none comes within `timeout` seconds."""
        ready = wait([self.conn, self.sentinel], timeout=timeout)
        if not ready:
            raise TimeoutError(f"no answer within {timeout:.0f}s")
        # a message the peer sent just before it exited is still delivered
        if self.conn in ready or self.conn.poll(0):
            try:
                return self.conn.recv()
            except (EOFError, OSError):
                raise PeerGone("the pipe closed") from None
        raise PeerGone("the other process has exited")

    def close(self) -> None:
        self.conn.close()
