"""Docker plumbing for the docker backend: clients, container create/remove, the warm
pool, and the sweep of containers left behind by crashed runs.

Every container carries `roll_agent.sandbox=1`, its owner "<pid>-<start time>" and the
host name; a container whose owner process is gone is garbage, whoever made it.
"""
from __future__ import annotations

import atexit
import collections
import dataclasses
import itertools
import logging
import socket
import threading
import time

from . import procs
from .base import SandboxError
from .channel import SERVER_CMD, Channel
from .config import LABEL, OWNER_LABEL, DockerConfig

log = logging.getLogger(__name__)
REMOVE_TIMEOUT_S = 60.0  # a busy daemon can refuse a removal for a while ("cannot kill", "in use")
REMOVE_ATTEMPTS = 3  # at least, also past the deadline: one call can take docker-py's whole 60 s timeout

HOST_LABEL = "roll_agent.host"
_lock = threading.Lock()
_clients: dict = {}
_swept: set = set()
_users: dict = {}
_pools: dict = {}


def client(docker_host: str | None):
    with _lock:
        if docker_host in _clients:
            return _clients[docker_host]
    import docker

    try:
        # max_pool_size: one HTTP connection per concurrent sandbox call, not a shared 10
        c = (docker.DockerClient(base_url=docker_host, timeout=120, max_pool_size=128) if docker_host
             else docker.from_env(timeout=120, max_pool_size=128))
        c.ping()
    except docker.errors.DockerException as e:
        raise SandboxError(f"cannot reach the Docker daemon ({e}); start it (`dockerd &`, as scripts/test.sh does) "
                           "or set docker_host / DOCKER_HOST") from e
    with _lock:
        return _clients.setdefault(docker_host, c)


def labels(cfg: DockerConfig) -> dict[str, str]:
    return {**cfg.labels, LABEL: "1", OWNER_LABEL: procs.owner_tag(), HOST_LABEL: socket.gethostname()}


def sweep_stale(docker_host: str | None) -> int:
    """Once per process: remove our-labelled containers whose owner process died."""
    with _lock:
        if docker_host in _swept:
            return 0
        _swept.add(docker_host)
    api = client(docker_host).api
    removed = 0
    for c in api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        lab = c.get("Labels") or {}
        if lab.get(HOST_LABEL) == socket.gethostname() and not procs.owner_alive(lab.get(OWNER_LABEL, "")):
            remove(api, c["Id"])
            removed += 1
    return removed


def effective_user(cfg: DockerConfig) -> str:
    """The user commands run as ("" = root): cfg.user, or with "auto" the image's USER."""
    if cfg.user != "auto":
        return "" if cfg.user.split(":")[0] in ("", "root", "0") else cfg.user
    key = (cfg.docker_host, cfg.image)
    if key not in _users:
        import docker

        try:
            info = client(cfg.docker_host).api.inspect_image(cfg.image)
        except docker.errors.ImageNotFound as e:
            raise SandboxError(f"docker image {cfg.image!r} not found; build it: python -m sandboxes.build_image") from e
        user = (info.get("Config") or {}).get("User") or ""
        _users[key] = "" if user.split(":")[0] in ("", "root", "0") else user
    return _users[key]


@dataclasses.dataclass
class Container:
    id: str
    channel: Channel | None  # None in exec_mode="exec"


def create_container(cfg: DockerConfig) -> Container:
    """Create and start a container; in server mode, also attach and wait until it answers."""
    import docker

    api = client(cfg.docker_host).api
    mb = 1024 * 1024
    server = cfg.exec_mode == "server"
    user = effective_user(cfg)
    # server mode: the server is root with just what it needs to start and kill commands
    # as `user`; the commands themselves end up with no capabilities (see container_server)
    caps = ["SETUID", "SETGID", "KILL"] if server and user else None
    host_config = api.create_host_config(
        network_mode=cfg.network, mem_limit=cfg.memory_mb * mb, memswap_limit=cfg.memory_mb * mb,
        pids_limit=cfg.pids, nano_cpus=int(cfg.cpus * 1e9) if cfg.cpus else None,
        ulimits=[docker.types.Ulimit(name="fsize", soft=cfg.file_size_mb * mb, hard=cfg.file_size_mb * mb),
                 docker.types.Ulimit(name="nofile", soft=cfg.nofile, hard=cfg.nofile),
                 docker.types.Ulimit(name="core", soft=0, hard=0)],
        cap_drop=["ALL"], cap_add=caps, security_opt=["no-new-privileges"], init=True, shm_size=cfg.shm_mb * mb,
        ipc_mode="private")
    try:
        cid = api.create_container(
            cfg.image, command=SERVER_CMD if server else ["sleep", "infinity"],
            user="0:0" if caps else user, environment={"ROLL_AGENT_USER": user} if caps else None,
            working_dir=cfg.workdir, hostname="sandbox", labels=labels(cfg), host_config=host_config,
            stdin_open=server)["Id"]
    except docker.errors.ImageNotFound as e:
        raise SandboxError(f"docker image {cfg.image!r} not found; build it: python -m sandboxes.build_image") from e
    try:
        api.start(cid)
        channel = Channel(api, cid) if server else None
        if channel:
            try:
                channel.ping()
            except SandboxError as e:
                raise SandboxError(f"{e}\n(exec_mode='server' needs python3 in the image {cfg.image!r}; "
                                   "without it, use exec_mode='exec')") from None
    except BaseException:
        remove(api, cid)
        raise
    return Container(cid, channel)


def remove(api, cid: str) -> None:
    """SIGKILL and delete at once: no 10 s stop grace period, nothing left behind. Returns once
    the daemon says the container is gone; a removal it refuses or is still doing (it can,
    under load) is asked again until REMOVE_TIMEOUT_S and REMOVE_ATTEMPTS times at least (a
    call that timed out client-side, after docker-py's 60 s, may have removed nothing), then
    logged (the sweep of a later start removes it once this process has exited)."""
    import docker
    import requests

    deadline, delay = time.monotonic() + REMOVE_TIMEOUT_S, 0.1
    for attempt in itertools.count(1):
        try:
            api.remove_container(cid, force=True, v=True)
            return
        except docker.errors.NotFound:
            return
        except (docker.errors.APIError, requests.exceptions.RequestException) as e:
            # "removal ... already in progress" (an earlier call timed out or failed half-way, and
            # the daemon goes on): asked again until it answers NotFound, so `close` returns with
            # the container gone
            if time.monotonic() > deadline and attempt >= REMOVE_ATTEMPTS:
                log.warning("could not remove sandbox container %s: %s", cid[:12], e)
                return
        time.sleep(delay)
        delay = min(2 * delay, 2.0)


def discard(cfg: DockerConfig, c: Container) -> None:
    if c.channel:
        c.channel.close()
    remove(client(cfg.docker_host).api, c.id)


class WarmPool:
    """Keeps `pool_size` started containers of one config; acquire() takes one at once.

    A container is never returned to the pool (an agent may have changed anything in
    it); the pool refills in a background thread instead.
    """

    def __init__(self, cfg: DockerConfig):
        self.cfg = cfg
        self.ready: collections.deque[Container] = collections.deque()
        self.cond = threading.Condition()
        self.closed = False
        self.errors = 0
        self.thread = threading.Thread(target=self._fill, name="roll-agent-docker-pool", daemon=True)
        self.thread.start()

    def acquire(self) -> Container | None:
        with self.cond:
            c = self.ready.popleft() if self.ready else None
            self.cond.notify_all()
        return c

    def wait_full(self, timeout: float = 60.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.ready) >= self.cfg.pool_size or self.closed, timeout)

    def _fill(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.closed or len(self.ready) < self.cfg.pool_size)
                if self.closed:
                    return
            try:
                c = create_container(self.cfg)
            except Exception:  # noqa: BLE001 - acquire() falls back to a cold start
                self.errors += 1
                if self.errors > 5:
                    return
                continue
            with self.cond:
                if self.closed:
                    discard(self.cfg, c)
                    return
                self.ready.append(c)
                self.cond.notify_all()

    def shutdown(self) -> None:
        with self.cond:
            self.closed = True
            left, self.ready = list(self.ready), collections.deque()
            self.cond.notify_all()
        for c in left:
            discard(self.cfg, c)
        self.thread.join(timeout=120)


def warm_pool(cfg: DockerConfig) -> WarmPool:
    key = repr(dataclasses.replace(cfg, pool_size=0))
    with _lock:
        p = _pools.get(key)
        if p is None or p.closed:
            p = _pools[key] = WarmPool(cfg)
    return p


@atexit.register
def shutdown_pools() -> None:
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for p in pools:
        p.shutdown()
