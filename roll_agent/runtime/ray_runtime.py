"""The Ray runtime: the same components as Ray actors, placed by a placement group.

    trainer actor (bundle 0: cpus/gpus_per_trainer)  <-- buffer and proxy actors (bundle 0, no resources
                                                          of their own: the run's state, on the trainer's node)
    engine actors  (bundles 1..E: cpus/gpus_per_engine)
    env-worker actors (bundles E+1..: cpus_per_env_worker), each a GroupScheduler over its share of the lanes

Each role's bundles (or, for env workers that reserve no CPU, the actors themselves) go to
nodes carrying its labels (`runtime.ray.*_labels`, Ray label selectors). A node lost mid-run
takes its actors with it: Ray places engine and env-worker bundles again on nodes left (or
waits for capacity), restarts those actors, and the run goes on; losing the trainer's node
(trainer, buffer, proxy) ends the run with an error that says to resume from its checkpoint.

The controller runs in this (the driver) process against façades with the local runtime's
interface. `runtime.ray.address` joins a running cluster; otherwise a local one is started
for the run, with its temp dir and logs under `output_dir/ray`, and stopped at the end.
An env worker that dies is restarted by Ray (max_restarts) and its lanes start new groups;
its episodes in flight end as `lost` in the buffer actor's episode ledger (`episodes_lost`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import tempfile
import uuid
from collections import Counter
from pathlib import Path

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import roll_agent
from roll_agent.config import Config, ConfigError
from roll_agent.protocols import Engine, Proxy, Trainer
from roll_agent.rollout.accounting import RolloutStats
from roll_agent.rollout.chat import ChatFormatter
from roll_agent.rollout.env_manager import EnvServices
from roll_agent.rollout.env_workers import EnvWorkers
from roll_agent.rollout.stack import RolloutStack
from roll_agent.runtime.forward import AsyncHost, Host, forwards
from roll_agent.runtime import ray_hosts
from roll_agent.runtime.ray_hosts import BufferHost, BufferSnapshot, EnvWorker, RemoteProxy, call
from roll_agent.runtime.ray_supervisor import WorkerSupervisor
from roll_agent.sync import weight_sync_type
from roll_agent.watchdog import Watchdog

log = logging.getLogger(__name__)
MAX_SOCKET_DIR = 60  # Ray's unix sockets live under the temp dir; AF_UNIX paths end at 107 bytes


def _temp_dir(output_dir: Path) -> str:
    """`output_dir/ray`, or a short dir under /tmp linked from there when that path is too long."""
    link = output_dir.resolve() / "ray"
    if len(str(link)) <= MAX_SOCKET_DIR:
        link.mkdir(parents=True, exist_ok=True)
        return str(link)
    short = tempfile.mkdtemp(prefix="roll-ray-")
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink() if link.is_symlink() else shutil.rmtree(link)
    link.symlink_to(short, target_is_directory=True)
    return short


def start_local_cluster(output_dir: Path, num_cpus: int, num_gpus: int = 0) -> None:
    """A Ray cluster on this machine, its temp dir and logs under `output_dir/ray`, whose
    workers import this checkout's packages."""
    here = str(Path(roll_agent.__file__).parent.parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=False,
             _temp_dir=_temp_dir(output_dir), namespace="roll_agent",
             runtime_env={"env_vars": {"PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false"}})


class RayRuntime:
    def __init__(self, cfg: Config, model_path: str, output_dir: Path):
        self.cfg, self.rc = cfg, cfg.runtime.ray
        self.model_path = model_path
        self.output_dir = output_dir
        weight_sync_type(cfg)  # checked before any work
        self.num_workers = min(self.rc.env_workers, cfg.rollout.num_env_groups)
        self.actors: list = []
        self.pg = None
        self.started_cluster = False
        self.env_workers = None  # the driver's warm-start makes its own (the rollout's live in the env-worker actors)

    # ---- cluster, placement ------------------------------------------------------
    async def __aenter__(self) -> "RayRuntime":
        rc = self.rc
        if rc.address:  # a running cluster: ship our packages to its workers
            import envs

            ray.init(address=rc.address, log_to_driver=False, namespace=f"roll_agent-{uuid.uuid4().hex[:8]}",
                     runtime_env={"py_modules": [str(Path(roll_agent.__file__).parent), str(Path(envs.__file__).parent)]})
        else:
            start_local_cluster(self.output_dir, rc.num_cpus or os.cpu_count(), rc.num_gpus)
            self.started_cluster = True
        try:
            await self._place()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _place(self) -> None:
        rc, cfg = self.rc, self.cfg
        bundles = [_bundle(rc.cpus_per_trainer, rc.gpus_per_trainer)]
        bundles += [_bundle(rc.cpus_per_engine, rc.gpus_per_engine)] * cfg.engine.num_engines
        if rc.cpus_per_env_worker:  # otherwise env workers reserve nothing and go anywhere
            bundles += [_bundle(rc.cpus_per_env_worker, 0)] * self.num_workers
        labels = [rc.trainer_labels] + [rc.engine_labels] * cfg.engine.num_engines
        labels += [rc.env_worker_labels] * (len(bundles) - len(labels))
        labelled = any(labels)
        self.pg = placement_group(bundles, strategy=rc.placement_strategy,
                                  bundle_label_selector=[dict(x) for x in labels] if labelled else None)
        try:
            await asyncio.wait_for(self.pg.ready(), rc.start_timeout_s)
        except asyncio.TimeoutError:
            wanted = f"{bundles} on nodes labelled {labels}" if labelled else str(bundles)
            nodes = [(n.get("Labels", {}), n["Resources"]) for n in ray.nodes() if n["Alive"]] if labelled else \
                ray.available_resources()
            raise ConfigError(
                f"the Ray cluster cannot place {wanted} ({rc.placement_strategy}) within {rc.start_timeout_s:.0f}s; "
                f"it has {nodes}. Lower runtime.ray.cpus_per_* / gpus_per_*, set runtime.ray.num_cpus, fix "
                "runtime.ray.*_labels, or add nodes") from None

    def _at(self, bundle: int | None, cpus: float = 0, gpus: float = 0, **extra):
        """Actor options: in placement-group bundle `bundle`, or when None on any node that
        carries the env workers' labels."""
        if bundle is None:
            labels = {"label_selector": dict(self.rc.env_worker_labels)} if self.rc.env_worker_labels else {}
            return {"num_cpus": cpus, "num_gpus": gpus, **labels, **extra}
        strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=bundle)
        return {"num_cpus": cpus, "num_gpus": gpus, "scheduling_strategy": strategy, **extra}

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            self.actors.clear()
            if self.pg is not None:
                remove_placement_group(self.pg)
                self.pg = None
        finally:
            ray.shutdown()
        if isinstance(exc, RayActorError):
            where = f" (nodes labelled {dict(self.rc.trainer_labels)})" if self.rc.trainer_labels else ""
            raise RuntimeError(
                f"the run lost an actor it cannot go on without: the trainer, the buffer and the proxy live on the "
                f"trainer's node{where}, and are not restarted. Ray said: {str(exc).splitlines()[0]} Resume from the "
                f"last checkpoint in {self.output_dir / 'checkpoints'} with resume=true once the cluster has that "
                "node (or another with its labels) back.") from exc

    # ---- components ----------------------------------------------------------------
    def make_trainer(self) -> "RemoteTrainer":
        rc = self.rc
        actor = ray.remote(Host).options(name="trainer", **self._at(0, rc.cpus_per_trainer, rc.gpus_per_trainer))
        handle = actor.remote(Trainer, build_trainer, self.cfg, self.model_path)
        self.actors.append(handle)
        return RemoteTrainer(handle)

    def make_rollout(self, formatter: ChatFormatter, trainer: "RemoteTrainer") -> "RayRollout":
        """The rollout actors; the proxy actor pushes the trainer actor's weights into the engine actors."""
        cfg, rc, version = self.cfg, self.rc, trainer.version
        engines = [ray.remote(AsyncHost).options(name=f"engine-{i}", **self._at(
                       1 + i, rc.cpus_per_engine, rc.gpus_per_engine, max_restarts=rc.max_restarts))
                   .remote(Engine, build_engine, cfg, self.model_path, cfg.seed + i) for i in range(cfg.engine.num_engines)]
        proxy = ray.remote(AsyncHost).options(name="proxy", **self._at(0, max_concurrency=10_000)).remote(
            Proxy, ray_hosts.build_proxy, cfg, engines, trainer.handle, version)
        buffer = ray.remote(BufferHost).options(name="buffer", **self._at(0, max_concurrency=10_000)).remote(
            cfg.rollout, version)
        first = 1 + cfg.engine.num_engines
        bundle = (lambda w: first + w) if rc.cpus_per_env_worker else (lambda w: None)
        workers = [ray.remote(EnvWorker).options(name=f"env-worker-{w}", **self._at(bundle(w), rc.cpus_per_env_worker,
                                                            max_restarts=rc.max_restarts, max_concurrency=10_000))
                   .remote(cfg, w, self.num_workers, self.model_path, proxy, buffer) for w in range(self.num_workers)]
        self.actors += [*workers, proxy, buffer, *engines]
        proxy_client, buffer_client = RemoteProxy(proxy, version), BufferClient(buffer)
        # the evaluation envs' (here in the driver): the warm-start has its own env workers
        services = EnvServices.build(formatter, cfg.rollout, proxy_client, [], ClusterWatchdog(cfg.watchdog),
                                     cfg.endpoint, EnvWorkers())
        supervisor = WorkerSupervisor(workers, buffer_client, version, rc.max_restarts)
        return RayRollout(proxy_client, buffer_client, supervisor, services)


def _threads(n: int) -> None:
    if n:  # otherwise Ray's default: as many intra-op threads as CPUs reserved for the actor
        import torch

        torch.set_num_threads(n)


def build_trainer(cfg: Config, model_path: str):
    """In the trainer actor (trainer.type=deepspeed: a world of one there)."""
    from roll_agent.train.trainer import trainer_for_run

    _threads(cfg.runtime.torch_threads)
    return trainer_for_run(cfg, model_path)


def build_engine(cfg: Config, model_path: str, seed: int):
    from roll_agent.proxy.engines import make_engines

    _threads(cfg.runtime.torch_threads)
    return make_engines(dataclasses.replace(cfg.engine, num_engines=1), cfg.model, model_path, seed=seed)[0]


def _bundle(cpus: float, gpus: float) -> dict:
    bundle = {k: v for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0}
    if not bundle:
        raise ConfigError("runtime.ray: the trainer and each engine need some CPU or GPU (cpus_per_* or gpus_per_*)")
    return bundle


# ---- the RolloutStack's parts in the driver ----------------------------------------------
class StoredBatch(list):
    """A batch's groups, read in the driver (the controller's metrics), and the reference to
    the buffer actor's answer, which is what goes to the trainer actor (it reads the object
    store itself: the batch is not serialized again by the driver)."""

    def __init__(self, groups: list, ref):
        super().__init__(groups)
        self.ref = ref


@forwards(Trainer)
class RemoteTrainer:
    """The trainer actor as the controller calls it (blocking, as the Trainer contract is)."""

    def __init__(self, handle):
        self.handle = handle
        self.__dict__.update(ray.get(handle.state.remote()))

    def _forward(self, name: str, args: tuple, kwargs: dict):
        args = tuple(a.ref if isinstance(a, StoredBatch) else a for a in args)
        return ray.get(self.handle.invoke.remote(name, args, kwargs))


class BufferClient:
    """The buffer actor as the driver's RolloutStack uses it: batches and versions by call, the
    rest (`len`, the ledger's counts and reasons, `state_dict`) from the snapshot of the last refresh."""

    def __init__(self, handle):
        self.handle = handle
        self.snapshot = BufferSnapshot()

    @property
    def ledger(self) -> BufferSnapshot:
        """The ledger's counts, reasons and examples as of the last refresh."""
        return self.snapshot

    @property
    def stats(self) -> dict:
        return self.snapshot.stats

    async def get_batch(self, version: int) -> StoredBatch:
        """The batch, and its object in the store for the trainer actor. A wait the controller
        cancels (a stalled batch) cancels the buffer actor's too, which then takes nothing."""
        ref = self.handle.get_batch.remote(version)
        return StoredBatch(await call(ref), ref)

    def __len__(self) -> int:
        return self.snapshot.waiting

    def state_dict(self, in_flight: int) -> dict:
        return self.snapshot.state  # the buffer actor counted the episodes in flight when it took it

    def load_state_dict(self, state: dict) -> None:
        ray.get(self.handle.load_state_dict.remote(state))

    async def set_version(self, version: int) -> None:
        await self.handle.set_version.remote(version)

    async def refresh(self) -> None:
        self.snapshot = await self.handle.snapshot.remote()


class ClusterWatchdog(Watchdog):
    """The driver's watchdog (batch waits, evaluation envs) plus what the actors' watchdogs
    reported at the last refresh (env workers: env stages and episodes; proxy: requests)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.remote_stats: Counter = Counter()
        self.remote_oldest: list[str] = []

    def metrics(self) -> dict[str, int]:
        total = self.stats + self.remote_stats
        return {f"watchdog_{k}": v for k, v in sorted(total.items())}

    def oldest(self, n: int = 10) -> list[str]:
        return (super().oldest(n) + [f"(at the last step) {w}" for w in self.remote_oldest])[:n]


class RayRollout(RolloutStack):
    """The RolloutStack over the actors: its proxy, buffer and scheduler are clients of the proxy
    actor, the buffer actor and the env-worker actors (supervised); the evaluation envs run
    here in the driver. What the controller reads synchronously (num_ready, stats, state_dict)
    answers from the snapshots of the last refresh, after each weight update and at stop."""

    async def refresh(self) -> None:
        report, _, _ = await asyncio.gather(self.proxy.refresh(), self.buffer.refresh(), self.scheduler.refresh())
        snaps = self.scheduler.snapshots
        self.watchdog.remote_stats = sum((Counter(s.watchdog) for s in snaps), Counter(report.watchdog))
        self.watchdog.remote_oldest = [w for s in snaps for w in s.oldest] + report.oldest

    def stats(self) -> RolloutStats:
        """As the local stack's, the env workers' counters added."""
        stats, snaps = super().stats(), self.scheduler.snapshots
        stats.env_worker_restarts += sum(s.env_worker_restarts for s in snaps)
        stats.agent_http = dict(sum((Counter(s.agent_http) for s in snaps), Counter(stats.agent_http)))
        return stats

    async def close(self) -> None:
        try:
            await super().close()
        except RayActorError:  # lost with its node: the run's error says so
            pass
