"""runtime.type=ray on a Ray cluster of several nodes on this machine (`ray.cluster_utils.Cluster`:
a raylet per node, each with its own resources and labels): roles placed by node labels,
weights checked by checksums on every engine across nodes, and whole nodes lost mid-run."""

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray._private.utils import get_ray_address_file  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from roll_agent.config_loader import load_config  # noqa: E402
from roll_agent.metrics import read_rows  # noqa: E402
from roll_agent.run import train  # noqa: E402
from tests.conftest import processes_naming, run  # noqa: E402
from tests.runtime.test_ray_runtime import _first_step  # noqa: E402
from tests.test_run import SMALL  # noqa: E402

NODE = {"object_store_memory": 100 * 1024**2}
PLACED = ["runtime.ray.trainer_labels={role: trainer}", "runtime.ray.engine_labels={role: engines}",
          "runtime.ray.env_worker_labels={role: envs}", "runtime.ray.placement_strategy=SPREAD",
          "runtime.ray.cpus_per_env_worker=1", "runtime.ray.env_workers=2", "engine.num_engines=2",
          "weight_sync.verify=true", "runtime.ray.start_timeout_s=120", "checkpoint.every=1", "checkpoint.keep_last=20",
          # a slow env keeps both env workers' groups in flight, so a lost node always takes episodes with it
          "envs=[{id: roll_agent/Simulated-v0, kwargs: {latency: fixed, mean_s: 0.3}}]", "rollout.max_turns=2"]


@pytest.fixture
def cluster():
    """Four nodes: the head (the driver's, and the engines'), the trainer's (not the head: it
    is lost in the test, and the head's GCS is the cluster) and two for env workers. Node death
    is detected at Ray's default pace (5 missed health checks 3 s apart): faster settings let a
    starved raylet on the loaded 2-core CI machine be declared dead, and the driver's job with it."""
    temp_dir = tempfile.mkdtemp(prefix="roll-ray-")  # short: Ray's unix socket paths end at 107 bytes
    # Cluster also records its address in Ray's default temp folder, which it does not create
    # (a fresh machine has no /tmp/ray)
    os.makedirs(os.path.dirname(get_ray_address_file(None)), exist_ok=True)
    c = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 2, "labels": {"role": "engines"},
                                                      "include_dashboard": False, "temp_dir": temp_dir})
    nodes = {"trainer": c.add_node(**NODE, num_cpus=1, labels={"role": "trainer"}),
             "envs-a": c.add_node(**NODE, num_cpus=2, labels={"role": "envs"}),
             "envs-b": c.add_node(**NODE, num_cpus=2, labels={"role": "envs"})}
    c.wait_for_nodes()
    yield c, nodes
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()
    assert processes_naming(temp_dir) == [], "the cluster's processes outlived it"


def placed() -> dict[str, tuple[str, str]]:
    """From Ray's actor table: each live named actor's (node id, node role label)."""
    roles = {n["NodeID"]: n.get("Labels", {}).get("role") for n in ray.nodes() if n["Alive"]}
    return {a["Name"]: (a["Address"]["NodeID"], roles.get(a["Address"]["NodeID"], "dead"))
            for a in ray._private.state.actors().values() if a["Name"] and a["State"] == "ALIVE"}


def _restarted_elsewhere(name: str, old_node: str, timeout_s: float = 120.0) -> tuple[str, str]:
    """Where Ray restarted actor `name`, once it is alive on another node. Blocking on purpose:
    it pauses the driver's event loop (the controller), so the run cannot train all its steps
    on the other env worker before the restart; Ray restarts actors without the driver."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        where = placed().get(name)
        if where and where[0] != old_node:
            return where
        time.sleep(0.2)
    raise AssertionError(f"{name} was not restarted on another node within {timeout_s:.0f} s")


CHILD = "ROLL_AGENT_MULTINODE_CHILD"  # set in the fresh interpreter that runs the scenario


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_multinode_cluster_in_a_fresh_interpreter(tmp_path):
    """Runs the scenario below in a pytest of its own. In the suite's process, after another
    test's Ray session, the cluster's first actor died before it started ('Actor creation
    cancelled', all references removed) in 2 of 2 full runs and in a 2-test reproduction,
    never alone (most likely driver-side state Ray keeps in a process from one session to the next)."""
    test = f"{Path(__file__).resolve()}::test_roles_on_labelled_nodes_weights_verified_and_lost_nodes"
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                            str(tmp_path / "child"), test], env={**os.environ, CHILD: "1"}, cwd=Path(__file__).parents[2],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=950)
    assert child.returncode == 0 and " passed" in child.stdout, child.stdout[-20000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not os.environ.get(CHILD), reason="run by test_multinode_cluster_in_a_fresh_interpreter")
def test_roles_on_labelled_nodes_weights_verified_and_lost_nodes(cluster, tmp_path):
    c, nodes = cluster
    base = SMALL + ["runtime.type=ray", f"runtime.ray.address={c.address}", f"output_dir={tmp_path}", *PLACED]

    # 1. every role on the nodes its labels name; a node of env workers lost mid-run
    async def lose_an_env_node():
        training = asyncio.create_task(train(load_config(None, base + ["max_steps=6"])))
        await _first_step(tmp_path, training)
        where = placed()
        assert {where[n][1] for n in ("trainer", "buffer", "proxy")} == {"trainer"}, where
        assert {where[n][1] for n in ("engine-0", "engine-1")} == {"engines"}, where
        workers = [where[f"env-worker-{w}"] for w in (0, 1)]
        assert {role for _, role in workers} == {"envs"} and workers[0][0] != workers[1][0], where  # SPREAD
        buffer = ray.get_actor("buffer")
        while not (await buffer.snapshot.remote()).held.get((0, 0)):  # env worker 0 plays a group
            await asyncio.sleep(0.05)
        lost = next(name for name, node in nodes.items() if node.node_id == workers[0][0])
        pid = await ray.get_actor("env-worker-0").pid.remote()
        c.remove_node(nodes.pop(lost), allow_graceful=False)  # its raylet and every process on it
        # A worker process outlives its killed raylet for a while: in that time it finished the group
        # it held and, with the driver paused below (no training, the buffer full), waited for
        # admission holding nothing, so its death lost nothing (0 lost in 1 CI run and 1 local run
        # of ~30). Dying with its node, as on a machine that is gone, it takes its group with it.
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        moved = _restarted_elsewhere("env-worker-0", workers[0][0])
        return await training, moved, workers[1]

    final, moved, other = run(lose_an_env_node(), timeout=400)
    assert final == 6 and moved == other  # env worker 0 restarted on the env node left
    rows = read_rows(tmp_path / "metrics.jsonl")
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 7))
    assert all(r["sync_verified_engines"] == 2 and r["sync_bytes"] > 0 for r in steps)  # checksums, both engines
    assert sum(r["episodes_lost"] for r in steps) > 0  # the lost node was playing a group
    # the lost episodes are an outcome of the ledger: started == sum(outcomes) + in flight, every row
    assert all(r["accounting_ok"] for r in rows if "accounting_ok" in r)
    assert [r for r in rows if "episodes_total_lost" in r][-1]["episodes_total_lost"] == \
        sum(r["episodes_lost"] for r in steps)

    # 2. the trainer's node lost: the run fails, saying how to resume; with the node back it resumes
    async def lose_the_trainer_node():
        training = asyncio.create_task(train(load_config(None, base + ["max_steps=12", "resume=true"])))
        await _first_step(tmp_path, training, after=6)
        c.remove_node(nodes.pop("trainer"), allow_graceful=False)
        with pytest.raises(RuntimeError, match="resume=true") as failed:
            await training
        return failed.value

    error = run(lose_the_trainer_node(), timeout=400)
    assert "trainer's node" in str(error)
    saved = max(int(p.name.split("_")[1]) for p in (tmp_path / "checkpoints").glob("step_*"))
    assert saved >= 6  # the first run's last step, or one the failed run saved before its node went
    nodes["trainer"] = c.add_node(**NODE, num_cpus=1, labels={"role": "trainer"})
    c.wait_for_nodes()
    assert run(train(load_config(None, base + [f"max_steps={saved + 1}", "resume=true"])), timeout=400) == saved + 1
    rows = read_rows(tmp_path / "metrics.jsonl")
    last_resume = max(i for i, r in enumerate(rows) if "resumed_from_step" in r)
    assert rows[last_resume]["resumed_from_step"] == saved
    resumed = [r for r in rows[last_resume:] if "loss" in r]
    assert [r["step"] for r in resumed] == [saved + 1]
    assert resumed[0]["episodes_lost"] == 0  # this step's own: the ledger resumes with the counts it saved

