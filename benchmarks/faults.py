"""Trained samples/s with faulty envs (10% of steps raise, 5% hang) vs fault-free, side by side.

Both arms run the same config in this process, alternating (A B A B ...) so machine noise
hits both: the real rollout stack (LLMProxy + scripted engines, EnvManagers, groups,
SampleBuffer) on the simulated env, with the trainer played by a fixed sleep per step.

Why hangs could cost throughput: a hung step holds its env until `step_timeout_s`, and a
group waiting on it cannot complete. The design's answers, both on in both arms:
- a short step timeout relative to the step latency: steps take ~normal(50 ms, 20 ms), so
  the timeout is 0.5 s (10x the mean, >20 std above it: a healthy step never hits it);
- redundancy: each group runs `group_size + group_size_redundancy` envs and completes at
  the first `group_size` good episodes (the hung and failed ones are cancelled or ignored),
  and more groups run than a batch needs, so a group that cannot complete does not hold
  the batch.
Faults are per env instance and step (transient infrastructure faults, not broken tasks).
The accounting identity (started == finished + truncated + cancelled + env_error +
stale_dropped + in flight) is checked after every batch and after shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import build_stack, make_formatter, result_line, sim_spec, table  # noqa: E402
from roll_agent.config import RolloutConfig, ScriptedEngineConfig  # noqa: E402
from roll_agent.controller import update_weights  # noqa: E402


async def run_arm(formatter, cfg: RolloutConfig, env: dict, engine_cfg, batches: int, train_s: float) -> dict:
    stack = build_stack(formatter, cfg, [sim_spec(**env)], engine_cfg)
    identity_ok = True
    samples = 0
    stack.scheduler.start()
    start = time.perf_counter()
    try:
        for v in range(batches):
            batch = await stack.buffer.get_batch(v)
            samples += sum(len(g.trajectories) for g in batch)
            identity_ok &= stack.stats().accounting()["accounting_ok"]
            await asyncio.sleep(train_s)  # the trainer's step; rollout goes on meanwhile
            await update_weights(stack, v + 1)
        seconds = time.perf_counter() - start
    finally:
        await stack.close()
    acc = stack.stats().accounting()
    return {"samples_per_s": samples / seconds, "seconds": seconds, "samples": samples,
            "accounted": identity_ok and acc["accounting_ok"], "stuck": stack.watchdog.stats["stuck_env"], **acc}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2, help="A/B alternations")
    ap.add_argument("--fail", type=float, default=0.10)
    ap.add_argument("--hang", type=float, default=0.05)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--step-timeout-s", type=float, default=0.5)
    ap.add_argument("--train-s", type=float, default=0.1)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--redundancy", type=int, default=4)
    ap.add_argument("--lanes", type=int, default=12)
    ap.add_argument("--groups-per-batch", type=int, default=8)
    args = ap.parse_args()
    logging.getLogger("roll_agent.watchdog").setLevel(logging.ERROR)  # one line per hung step: counted instead

    cfg = RolloutConfig(async_ratio=2, num_env_groups=args.lanes, groups_per_batch=args.groups_per_batch,
                        group_size=args.group_size, group_size_redundancy=args.redundancy, max_turns=4,
                        step_timeout_s=args.step_timeout_s)
    mean = args.step_ms / 1000
    clean = dict(latency="normal", mean_s=mean, std_s=0.4 * mean, episode_len=3)
    faulty = dict(clean, fail_prob=args.fail, hang_prob=args.hang, hang_s=3600.0)
    engine_cfg = ScriptedEngineConfig(response_tokens=4, token_latency_s=0.002)
    formatter = make_formatter()
    arms: dict[str, list[dict]] = {"fault-free": [], "faulty": []}
    for _ in range(args.rounds):
        for name, env in (("fault-free", clean), ("faulty", faulty)):
            arms[name].append(asyncio.run(run_arm(formatter, cfg, env, engine_cfg, args.batches, args.train_s)))

    rows = []
    for name, results in arms.items():
        last = results[-1]
        rows.append((name, statistics.mean(r["samples_per_s"] for r in results), last["episodes_total_started"],
                     last["episodes_total_finished"] + last["episodes_total_truncated"],
                     last["episodes_total_cancelled"], last["episodes_total_env_error"],
                     last["episodes_total_stale_dropped"], last["episodes_in_flight"], last["stuck"],
                     str(last["accounting_ok"])))
    print(f"{args.fail:.0%} failing steps, {args.hang:.0%} hanging steps; step ~normal({args.step_ms:.0f} ms, "
          f"{0.4 * args.step_ms:.0f} ms), step_timeout_s={args.step_timeout_s}, train step {args.train_s}s, "
          f"{args.lanes} lanes x ({args.group_size}+{args.redundancy}) envs, {args.groups_per_batch} groups/batch, "
          f"{args.batches} batches x {args.rounds} rounds per arm")
    print(table(rows, ("arm", "samples/s", "started", "trained", "cancelled", "env_error", "stale", "in_flight",
                       "stuck_steps", "identity")))
    for name, results in arms.items():
        r = results[-1]
        print(f"{name}: started {r['episodes_total_started']} == trained "
              f"{r['episodes_total_finished'] + r['episodes_total_truncated']} + cancelled "
              f"{r['episodes_total_cancelled']} + env_error {r['episodes_total_env_error']} + stale_dropped "
              f"{r['episodes_total_stale_dropped']} + in flight {r['episodes_in_flight']}: {r['accounting_ok']}")
    ratio = rows[1][1] / rows[0][1]
    accounted = all(r["accounted"] for results in arms.values() for r in results)
    print(result_line(ratio=ratio, accounted=str(accounted).lower(), faulty_samples_per_s=rows[1][1],
                      clean_samples_per_s=rows[0][1], fail=args.fail, hang=args.hang,
                      step_timeout_s=args.step_timeout_s))


if __name__ == "__main__":
    main()
