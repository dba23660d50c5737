import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

import roll_agent  # noqa: F401  before torch, as in a user's run: it sets OpenMP's wait policy
import torch  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the one real ALFWorld game shipped beside the repository (../shared/data/alfworld)
_ALFWORLD = Path(__file__).resolve().parents[2] / "shared" / "data" / "alfworld"
if _ALFWORLD.is_dir():
    os.environ.setdefault("ALFWORLD_DATA", str(_ALFWORLD))


# -- process-wide state: every test leaves it as it found it, so no verdict depends on order --
_TORCH_THREADS = torch.get_num_threads()
_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1]  # not SIGALRM: pytest-timeout's


@pytest.fixture(autouse=True)
def _restore_process_state():
    """Undo what a test (or the run it drove) changed process-wide: environment variables
    (RANK, MASTER_ADDR, ROLL_AGENT_CACHE, ...), the working directory, torch's thread count,
    signal handlers, a Ray session left initialised by a failed test, the short Ray temp dirs
    its runs made under /tmp (roll_agent/runtime/ray_runtime.py::_temp_dir; a user's run keeps
    its logs there), and the warm pools of started sandbox containers a test's envs made
    (they live for the process otherwise)."""
    environ, cwd = dict(os.environ), os.getcwd()
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    ray_dirs = set(Path(tempfile.gettempdir()).glob("roll-ray-*"))
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        warnings.warn("the test left Ray initialised: shut down here", stacklevel=1)
        ray.shutdown()
    for d in set(Path(tempfile.gettempdir()).glob("roll-ray-*")) - ray_dirs:
        if not processes_naming(d):  # not a concurrent test session's live cluster (its sockets are in there)
            shutil.rmtree(d, ignore_errors=True)
    if (pool := sys.modules.get("sandboxes.pool")) is not None:
        pool.shutdown_pools()
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    if torch.get_num_threads() != _TORCH_THREADS:
        torch.set_num_threads(_TORCH_THREADS)
    for sig, handler in handlers.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)


def processes_naming(path) -> list[int]:
    """Pids of running processes whose command line names `path` (a Ray session's temp dir)."""
    needle = str(path).encode()
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(int(pid))
        except OSError:
            continue
    return pids


@contextlib.contextmanager
def ray_cluster(temp_dir: Path, num_cpus: int = 2):
    """A local Ray cluster of this test's own (as the run starts one: temp dir and logs under
    `temp_dir/ray`), shut down when the block ends, also when it raised."""
    import ray

    from roll_agent.runtime.ray_runtime import start_local_cluster

    start_local_cluster(temp_dir, num_cpus)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def tokenizer():
    from roll_agent.tiny_model import build_tokenizer

    corpus = ["left right up down", "You are on frozen ice. Goal: 2 down.", "task 3 step 1", "Answer with any text."] * 20
    return build_tokenizer(corpus, vocab_size=300)


@pytest.fixture(scope="session")
def formatter(tokenizer):
    from roll_agent.rollout.chat import ChatFormatter

    return ChatFormatter(tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A real (random-weight) transformers checkpoint with the project's tokenizer."""
    from roll_agent.config import EnvSpec, TinyModelConfig
    from roll_agent.tiny_model import build_tiny_model, env_corpus

    out = tmp_path_factory.mktemp("tiny_model")
    corpus = lambda: env_corpus([EnvSpec()], episodes_per_env=8)  # noqa: E731
    return str(build_tiny_model(out, TinyModelConfig(vocab_size=400, hidden_size=64, intermediate_size=128), corpus))


@pytest.fixture(scope="session")
def dumped_run(tmp_path_factory):
    """A real 2-step run with rollout dumps on (tests/test_trajectory_dumps.py, tests/test_view.py),
    and the batches its trainer got, recorded as it trained them. More lanes than a batch needs
    and async ratio 1: step 2 trains groups sampled at version 0 (stale tokens to show)."""
    import copy

    from roll_agent.run import train
    from roll_agent.train.policy import PolicyTrainer
    from tests.test_run import small_cfg

    out = tmp_path_factory.mktemp("dumped-run")
    trained: dict = {}
    original = PolicyTrainer.step

    def recording_step(self, groups, capture=()):
        trained[self.version + 1] = copy.deepcopy(groups)
        return original(self, groups, capture)

    PolicyTrainer.step = recording_step
    try:
        cfg = small_cfg(out, "rollout.num_env_groups=4", "rollout.groups_per_batch=1", "rollout.async_ratio=1",
                        "runtime.trainer_process=false", "checkpoint.every=1", "logging.trajectories.groups=1")
        assert run(train(cfg), timeout=300) == 2
    finally:
        PolicyTrainer.step = original
    return out, trained


CANCEL_CLEANUP_S = 30.0  # how long a timed-out run gets to clean up after it is cancelled


def run(coro, timeout: float = 60.0):
    """Run a coroutine with a hard timeout, so a deadlock fails the test (printing where
    every task waits) instead of hanging it."""
    return asyncio.run(_guarded(coro, timeout))


async def _guarded(coro, timeout: float):
    import io

    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if done:
        return task.result()
    stacks = io.StringIO()
    for other in asyncio.all_tasks():
        if other is not asyncio.current_task():
            other.print_stack(limit=6, file=stacks)
    print(stacks.getvalue(), file=sys.stderr)
    # cancel it and let its cleanup run here (a Ray cluster shut down, threads joined), so
    # what it started does not outlive this test and weigh on the next one
    task.cancel()
    await asyncio.wait({task}, timeout=CANCEL_CLEANUP_S)
    raise TimeoutError(f"timed out after {timeout}s; task stacks printed to stderr")


def tiny_batch():
    """One group of 4 two-segment trajectories (prompt + 3 generated tokens), rewards 0/1."""
    from roll_agent.types import Group, Trajectory

    trajs = []
    for i in range(4):
        t = Trajectory(group_id=0, reward=float(i % 2))
        t.append([1, 2, 3, 4], generated=False)
        t.append([10 + i, 11, 12], generated=True, logprobs=[-2.0] * 3, versions=[0] * 3)
        trajs.append(t)
    return [Group(0, 0, "x", trajs)]
