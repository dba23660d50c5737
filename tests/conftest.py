import asyncio
import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the one real ALFWorld game shipped beside the repository (../shared/data/alfworld)
_ALFWORLD = Path(__file__).resolve().parents[2] / "shared" / "data" / "alfworld"
if _ALFWORLD.is_dir():
    os.environ.setdefault("ALFWORLD_DATA", str(_ALFWORLD))


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


def run(coro, timeout: float = 60.0):
    """Run a coroutine with a hard timeout, so a deadlock fails the test (printing where
    every task waits) instead of hanging it."""
    return asyncio.run(_guarded(coro, timeout))


async def _guarded(coro, timeout: float):
    import io
    import sys

    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if done:
        return task.result()
    stacks = io.StringIO()
    for other in asyncio.all_tasks():
        if other is not asyncio.current_task():
            other.print_stack(limit=6, file=stacks)
    print(stacks.getvalue(), file=sys.stderr)
    task.cancel()
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
