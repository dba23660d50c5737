"""Load: 1,000 env instances at once in one process (scripted engines, simulated env).

The real rollout stack with `lanes x group_size` EnvManagers (default 125 x 8 = 1,000),
admission wide enough that every lane runs at once, the trainer played by a short sleep.
Reports env steps/s (one model turn + one env step each), the most episodes seen running
at once, peak RSS, and RSS sampled over the run (bounded memory: it levels off once every
env exists, instead of growing with the number of episodes played). The accounting
identity is checked at the end. No deadlock: the run must finish within --timeout-s.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import build_stack, make_formatter, result_line, sim_spec  # noqa: E402
from roll_agent.config import RolloutConfig, ScriptedEngineConfig  # noqa: E402
from roll_agent.controller import update_weights  # noqa: E402
from roll_agent.rollout.accounting import OUTCOMES  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


async def run_load(formatter, lanes: int, group_size: int, batches: int, step_ms: float, train_s: float) -> dict:
    cfg = RolloutConfig(async_ratio=2, num_env_groups=lanes, groups_per_batch=max(1, lanes // 2),
                        group_size=group_size, group_size_redundancy=0, max_turns=4, step_timeout_s=30.0)
    mean = step_ms / 1000
    spec = sim_spec(latency="normal", mean_s=mean, std_s=0.4 * mean, episode_len=4, min_len=2)
    stack = build_stack(formatter, cfg, [spec], ScriptedEngineConfig(response_tokens=4), num_engines=4)
    peak_running, rss = 0, []

    async def sample():
        nonlocal peak_running
        while True:
            peak_running = max(peak_running, sum(len(lane.running) for lane in stack.scheduler.lanes))
            rss.append(rss_mb())
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample())
    stack.scheduler.start()
    start = time.perf_counter()
    trained = 0
    try:
        for v in range(batches):
            batch = await stack.buffer.get_batch(v)
            trained += sum(len(g.trajectories) for g in batch)
            await asyncio.sleep(train_s)
            await update_weights(stack, v + 1)
        seconds = time.perf_counter() - start
        steps = stack.proxy.stats["requests"]
    finally:
        sampler.cancel()
        await stack.close()
    half = len(rss) // 2
    return {"envs": lanes * group_size, "seconds": seconds, "steps": steps, "steps_per_s": steps / seconds,
            "trained": trained, "peak_running": peak_running, "rss_first_half_mb": max(rss[:half] or [0.0]),
            "rss_second_half_mb": max(rss[half:] or [0.0]), "rss_samples": rss, **stack.stats().accounting()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=125)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--train-s", type=float, default=0.05)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    args = ap.parse_args()
    formatter = make_formatter()
    r = asyncio.run(asyncio.wait_for(
        run_load(formatter, args.lanes, args.group_size, args.batches, args.step_ms, args.train_s), args.timeout_s))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{r['envs']} env instances ({args.lanes} lanes x {args.group_size}), step ~normal({args.step_ms:.0f} ms), "
          f"{args.batches} batches of {args.lanes // 2} groups in {r['seconds']:.1f}s")
    print(f"most episodes running at once: {r['peak_running']}; env steps: {r['steps']}; trained: {r['trained']}")
    every = max(1, len(r["rss_samples"]) // 20)
    print("RSS over the run (MB): " + " ".join(f"{x:.0f}" for x in r["rss_samples"][::every]))
    print(f"RSS peak first half {r['rss_first_half_mb']:.0f} MB, second half {r['rss_second_half_mb']:.0f} MB")
    ended = " + ".join(f"{k} {r['episodes_total_' + k]}" for k in OUTCOMES)
    print(f"accounting: started {r['episodes_total_started']} == {ended} + in flight {r['episodes_in_flight']}: "
          f"{r['accounting_ok']}")
    print(result_line(steps_per_s=r["steps_per_s"], peak_rss_mb=peak, envs=r["envs"], peak_running=r["peak_running"],
                      trained=r["trained"], rss_growth_mb=r["rss_second_half_mb"] - r["rss_first_half_mb"],
                      accounted=str(r["accounting_ok"]).lower()))


if __name__ == "__main__":
    main()
