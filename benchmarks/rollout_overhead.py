"""Framework overhead: env steps per second of the whole rollout stack (LLMProxy +
EnvManagers + GroupScheduler + SampleBuffer, batches consumed with version bumps) when
nothing is slow -- scripted engine with zero latency, simulated env with no latency.
Everything measured is the stack's own Python cost on one event loop.

One plain run measures throughput; a second, shorter run under cProfile shows where
the time goes (top functions by cumulative and by own time).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import build_stack, consume, make_formatter, result_line, sim_spec, table  # noqa: E402
from roll_agent.config import RolloutConfig, ScriptedEngineConfig  # noqa: E402


async def run(formatter, cfg: RolloutConfig, batches: int) -> dict:
    # zero latency everywhere: what is left is the stack's own cost per step
    spec = sim_spec(latency="none", episode_len=cfg.max_turns)
    stack = build_stack(formatter, cfg, [spec], ScriptedEngineConfig(response_tokens=4))
    steps, episodes = [], []

    def count(v, batch):
        trajs = [t for g in batch for t in g.trajectories]
        steps.append(sum(t.num_turns for t in trajs))
        episodes.append(len(trajs))

    # the first batch includes building the envs and warming caches: measured separately
    seconds, fills = await consume(stack, batches + 1, count)
    steady = seconds - fills[0]
    return {"steps_per_s": sum(steps[1:]) / steady, "episodes_per_s": sum(episodes[1:]) / steady,
            "seconds": steady, "requests": stack.proxy.stats["requests"], "steps": sum(steps[1:]),
            "started": stack.buffer.ledger.counts["started"], "total_seconds": seconds}


def component(path: str, name: str) -> str:
    """Group profiler rows by where the code lives: our packages, a library, or the stdlib."""
    root = str(Path(__file__).resolve().parents[1]) + "/"
    if path.startswith(root):
        return path[len(root):]
    if "site-packages/transformers/" in path or "tokenizers." in name:
        return "tokenizer (transformers + tokenizers)"
    if "site-packages/" in path:
        return path.split("site-packages/")[1].split("/")[0] + " (library)"
    if "/asyncio/" in path or "/concurrent/" in path or "threading" in path or "_thread" in name:
        return "asyncio + thread pool (stdlib)"
    return "other builtins (C calls)" if path == "~" else "other stdlib"


def profile(formatter, cfg: RolloutConfig, batches: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(run(formatter, cfg, batches))
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    # own time per component says which part of the stack costs what
    own: dict[str, float] = {}
    for (path, _, name), (_, _, tottime, _, _) in stats.stats.items():
        own[component(path, name)] = own.get(component(path, name), 0.0) + tottime
    stats.strip_dirs().sort_stats("cumulative").print_stats(15)
    lines = [line for line in out.getvalue().splitlines()
             if line.strip() and "Ordered by" not in line and "List reduced" not in line]
    total = sum(own.values())
    lines.append("\nown time by component:")
    lines += [f"  {t / total:6.1%}  {t:6.3f}s  {name}" for name, t in sorted(own.items(), key=lambda x: -x[1])[:10]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized run (< 30 s)")
    ap.add_argument("--groups", type=int, default=32, help="lanes (env groups)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8, help="steps per episode")
    ap.add_argument("--batches", type=int, default=None)
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    batches = args.batches or (10 if args.quick else 30)
    repeats = 2 if args.quick else 3  # median of a few runs: the machine is noisy
    # redundancy 0 and num_env_groups = 2 x groups_per_batch: no wasted episodes (nothing is
    # cancelled), and async ratio 2 (the ROLL Flash sweet spot) keeps every lane busy
    cfg = RolloutConfig(async_ratio=2, num_env_groups=args.groups, groups_per_batch=args.groups // 2,
                        group_size=args.group_size, group_size_redundancy=0, max_turns=args.turns,
                        max_new_tokens=8)
    envs = args.groups * args.group_size
    formatter = make_formatter()

    runs = sorted((asyncio.run(run(formatter, cfg, batches)) for _ in range(repeats)), key=lambda r: r["steps_per_s"])
    result = runs[len(runs) // 2]
    print(f"envs={envs} ({args.groups} groups x {args.group_size}), {args.turns} turns/episode, "
          f"batch={cfg.episodes_per_batch} episodes, async_ratio={cfg.async_ratio}, zero latency; "
          f"median of {repeats} runs (min {runs[0]['steps_per_s']:.0f}, max {runs[-1]['steps_per_s']:.0f} steps/s)")
    print(table([(envs, batches, result["steps"], result["seconds"], result["steps_per_s"],
                  result["episodes_per_s"], 1e6 / result["steps_per_s"])],
                ("envs", "batches", "env steps", "seconds", "steps/s", "episodes/s", "us/step")))
    if not args.no_profile:
        print(f"\ncProfile of a {max(3, batches // 4)}-batch run (profiling slows it; look at the shares):")
        print(profile(formatter, cfg, max(3, batches // 4)))
    print(result_line(steps_per_s=result["steps_per_s"], envs=envs))


if __name__ == "__main__":
    main()
