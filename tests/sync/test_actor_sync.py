"""Weight sync between a trainer actor and engine actors: the bucketed torch.distributed
broadcast (gloo), and LoRA adapters through the object store."""

import pytest

ray = pytest.importorskip("ray")

from roll_agent.config_loader import load_config  # noqa: E402
from roll_agent.protocols import Engine, Trainer  # noqa: E402
from roll_agent.runtime.forward import AsyncHost, Host  # noqa: E402
from roll_agent.runtime.ray_hosts import RemoteEngine  # noqa: E402
from roll_agent.runtime.ray_runtime import build_engine, build_trainer  # noqa: E402
from roll_agent.sync.actors import BroadcastSync, ObjectStoreSync, check_checksums, checksums  # noqa: E402
from tests.conftest import ray_cluster, run  # noqa: E402


def _checksum(component, which: str) -> float:
    """Inside the actor: the sum of what a sync moves (all weights, or only the LoRA adapters)."""
    tensors = component._params.values() if which == "engine" else [t for _, t in component.named_weights()]
    return float(sum(t.double().sum() for t in tensors))


def _perturb(trainer) -> None:
    import torch

    with torch.no_grad():
        for _, p in trainer.named_weights():
            p.add_(torch.randn_like(p))


@pytest.fixture
def cluster(tmp_path):
    with ray_cluster(tmp_path):
        yield


async def _sync_twice(cfg, model_dir: str, make_sync) -> list[tuple[float, list[float]]]:
    trainer = ray.remote(Host).options(num_cpus=0).remote(Trainer, build_trainer, cfg, model_dir)
    engines = [ray.remote(AsyncHost).options(num_cpus=0).remote(Engine, build_engine, cfg, model_dir, i)
               for i in range(2)]
    remote = [RemoteEngine(h, i) for i, h in enumerate(engines)]
    sync = make_sync(trainer)
    sums = []
    try:
        for version in (1, 2):  # the second push reuses the group formed by the first
            await trainer.apply.remote(_perturb)
            report = await sync.push(remote, version)
            assert report["bytes"] > 0
            assert report.get("verified_engines") == (2 if sync.verify else None)
            sums.append((await trainer.apply.remote(_checksum, "trainer"),
                         [await e.apply.remote(_checksum, "engine") for e in engines]))
    finally:
        for actor in (trainer, *engines):
            ray.kill(actor)
    return sums


@pytest.mark.slow
def test_broadcast_moves_the_trainer_weights_into_every_engine_actor(cluster, tiny_model_dir):
    cfg = load_config(None, ["weight_sync.bucket_mb=0.05"])  # many buckets
    sums = run(_sync_twice(cfg, tiny_model_dir, lambda t: BroadcastSync(t, 0.05, verify=True)), timeout=240)
    for trainer_sum, engine_sums in sums:
        assert engine_sums == pytest.approx([trainer_sum] * 2, rel=1e-6)
    assert sums[0][0] != sums[1][0]


@pytest.mark.slow
def test_lora_adapters_go_through_the_object_store(cluster, tiny_model_dir):
    cfg = load_config(None, ["model.lora.enabled=true"])
    sums = run(_sync_twice(cfg, tiny_model_dir, ObjectStoreSync), timeout=240)
    for trainer_sum, engine_sums in sums:
        assert engine_sums == pytest.approx([trainer_sum] * 2, rel=1e-6)


def test_verify_fails_a_sync_whose_tensors_changed_on_the_way():
    import torch

    sent = [("a", torch.arange(6.0).reshape(2, 3)), ("b", torch.ones(4))]
    trainer = checksums(sent)

    class Engine:
        index = 1

    check_checksums(trainer, [Engine()], [checksums(sent)])  # the same tensors pass
    swapped = [("a", torch.tensor([[1.0, 0, 2], [3, 4, 5]])), ("b", torch.ones(4))]  # same sum, moved values
    missing = [("a", sent[0][1])]
    for received in (swapped, missing):
        with pytest.raises(RuntimeError, match="engine 1 received"):
            check_checksums(trainer, [Engine()], [checksums(received)])
