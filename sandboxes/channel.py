"""Host side of the container command server (container_server.py): requests go to the
container's stdin over a docker attach connection, answers come back as docker's
multiplexed stdout/stderr frames.
"""
from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
from pathlib import Path

from .base import SandboxError

_POLL_S = 0.25  # how often a waiting request checks whether the channel was closed
SERVER_SOURCE = (Path(__file__).parent / "container_server.py").read_text()
SERVER_CMD = ["python3", "-u", "-c", SERVER_SOURCE]


class ServerGone(SandboxError):
    """The container's command server exited (container killed, OOM, or `kill -9 -1`)."""


class Channel:
    def __init__(self, api, cid: str):
        self.cid = cid
        self.sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        self.raw = getattr(self.sock, "_sock", self.sock)
        self.frames = b""  # undecoded docker frames
        self.data = b""  # decoded server stdout
        self.stderr = b""  # the server's own errors (a traceback if it died)
        self.lock = threading.Lock()  # one request at a time: answers are not interleaved
        self.seq = 0
        self.closed = False

    def request(self, req: dict, deadline: float) -> tuple[dict, bytes]:
        """Send `req`, wait for its answer; TimeoutError at `deadline` (monotonic)."""
        with self.lock:
            if self.closed:
                raise ServerGone("the sandbox's command channel is closed")
            self.seq += 1
            req = {**req, "id": self.seq}
            self.raw.sendall(json.dumps(req).encode() + b"\n")
            while True:
                head = self._parse()
                if head is not None:
                    if head.get("id") == req["id"]:
                        return head, self._last_payload
                    continue  # a late answer to an abandoned request
                self._recv(deadline)

    def ping(self, timeout: float = 30.0) -> None:
        self.request({"op": "ping"}, time.monotonic() + timeout)

    def _parse(self) -> dict | None:
        nl = self.data.find(b"\n")
        if nl < 0:
            return None
        head = json.loads(self.data[:nl])
        end = nl + 1 + head["n"]
        if len(self.data) < end:
            return None
        self._last_payload = self.data[nl + 1:end]
        self.data = self.data[end:]
        return head

    def _recv(self, deadline: float) -> None:
        chunk = None
        while chunk is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from the sandbox's command server")
            if self.closed:  # by close() in another thread (a blocked select is not reliably woken)
                chunk = b""
                break
            try:
                ready, _, _ = select.select([self.raw], [], [], min(left, _POLL_S))
                chunk = self.raw.recv(1 << 20) if ready else None
            except (OSError, ValueError):  # the socket was closed under us
                chunk = b""
        if not chunk:
            self.closed = True
            err = self.stderr.decode(errors="replace").strip()[-2000:]
            raise ServerGone(f"the sandbox's container stopped serving commands{': ' + err if err else ''}")
        self.frames += chunk
        while len(self.frames) >= 8:  # frame: 1 byte stream id, 3 pad, 4 byte big-endian size
            kind, size = self.frames[0], struct.unpack(">I", self.frames[4:8])[0]
            if len(self.frames) < 8 + size:
                break
            payload, self.frames = self.frames[8:8 + size], self.frames[8 + size:]
            if kind == 2:
                self.stderr = (self.stderr + payload)[-65536:]
            else:
                self.data += payload

    def close(self) -> None:
        self.closed = True
        try:  # shutdown, not just close: it wakes a thread blocked reading this socket
            self.raw.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for s in (self.sock, self.raw):
            try:
                s.close()
            except OSError:
                pass
