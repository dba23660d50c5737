"""Time to fill a batch when 10% of envs are stragglers (10x step latency): with group
redundancy (more lanes than a batch needs, plus group_size_redundancy) vs without.

Stragglers are whole lanes: a second EnvSpec with 10x mean latency gets
`num_groups` = 10% of the lanes, in both variants (so lane counts are multiples of 10):
  without: groups_per_batch lanes, redundancy 0     (e.g. 20 lanes,  2 slow, 80 envs)
  with:    1.5x groups_per_batch lanes, redundancy 1 (e.g. 30 lanes, 3 slow, 150 envs)
The straggler share of env instances is exactly 10% in both. (The simulated env draws
its latency from the task seed, so the envs of one group step in lockstep: here the
gain comes from group-level redundancy; group_size_redundancy rides along.)

Async ratio 0 (on-policy): every batch is generated from scratch after the previous
step, so its fill time is exactly what a straggler inflates. (With a > 0 the fast lanes
run ahead and fill batches with second groups, hiding part of the straggler even
without redundancy; --async-ratio shows that.) The real stack plays, with zero
training time: the first batch (env construction) is not averaged.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import build_stack, consume, make_formatter, result_line, sim_spec, table  # noqa: E402
from roll_agent.config import RolloutConfig, ScriptedEngineConfig  # noqa: E402

STRAGGLER_SHARE = 0.1
SLOWDOWN = 10.0


def specs_for(lanes: int, mean_s: float, episode_len: int):
    slow = round(lanes * STRAGGLER_SHARE)
    if slow != lanes * STRAGGLER_SHARE:
        raise SystemExit(f"{lanes} lanes cannot hold exactly {STRAGGLER_SHARE:.0%} stragglers; "
                         "use a lane count that is a multiple of 10")
    common = dict(latency="normal", episode_len=episode_len)
    fast = sim_spec("fast", lanes - slow, mean_s=mean_s, std_s=0.4 * mean_s, **common)
    straggler = sim_spec("straggler", slow, mean_s=SLOWDOWN * mean_s, std_s=SLOWDOWN * 0.4 * mean_s, **common)
    return [fast, straggler]


async def run_variant(formatter, cfg: RolloutConfig, specs, engine_cfg, batches: int) -> dict:
    stack = build_stack(formatter, cfg, specs, engine_cfg)
    tags = []
    _, fills = await consume(stack, batches + 1, lambda v, batch: tags.extend(g.env_tag for g in batch))
    counts, episodes = stack.scheduler.counts, stack.buffer.ledger.counts
    lane_size = cfg.group_size + cfg.group_size_redundancy
    # group accounting shows the work redundancy costs: every started group is put in the
    # buffer, cancelled as stale, or still running at the end (at most one per lane)
    return {"fills": fills[1:], "straggler_groups": tags.count("straggler"), "aborted": episodes["cancelled"],
            "groups_started": episodes["started"] // lane_size, "groups_put": stack.buffer.stats["groups_put"],
            "stale_cancelled": counts["groups_stale"], "lanes": cfg.num_env_groups}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized run (< 30 s)")
    ap.add_argument("--groups-per-batch", type=int, default=20)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--lanes-factor", type=float, default=1.5, help="lanes per batch group, with redundancy")
    ap.add_argument("--batches", type=int, default=None, help="averaged batches per variant and round")
    ap.add_argument("--rounds", type=int, default=None, help="rounds, variants interleaved against drift")
    ap.add_argument("--async-ratio", type=int, default=0)
    ap.add_argument("--mean-s", type=float, default=0.05, help="mean step latency of a fast env")
    args = ap.parse_args()
    batches = args.batches or (3 if args.quick else 6)
    rounds = args.rounds or (1 if args.quick else 2)
    gpb, episode_len = args.groups_per_batch, 5
    with_lanes = round(gpb * args.lanes_factor)
    engine_cfg = ScriptedEngineConfig(response_tokens=4, token_latency_s=0.001)
    base = dict(async_ratio=args.async_ratio, groups_per_batch=gpb, group_size=args.group_size,
                max_turns=episode_len, max_new_tokens=8)
    variants = {
        "without": (RolloutConfig(num_env_groups=gpb, group_size_redundancy=0, **base),
                    specs_for(gpb, args.mean_s, episode_len)),
        "with": (RolloutConfig(num_env_groups=with_lanes, group_size_redundancy=1, **base),
                 specs_for(with_lanes, args.mean_s, episode_len)),
    }
    formatter = make_formatter()

    results = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (cfg, specs) in variants.items():
            results[name].append(asyncio.run(run_variant(formatter, cfg, specs, engine_cfg, batches)))

    rows, mean, lost = [], {}, {}
    for name, (cfg, specs) in variants.items():
        fills = [f for r in results[name] for f in r["fills"]]
        mean[name] = statistics.fmean(fills)
        envs = cfg.num_env_groups * (cfg.group_size + cfg.group_size_redundancy)
        slow_envs = specs[1].num_groups * (cfg.group_size + cfg.group_size_redundancy)
        total = {k: sum(r[k] for r in results[name]) for k in results[name][0] if k != "fills"}
        lost[name] = total["groups_started"] - total["groups_put"] - total["stale_cancelled"] - total["lanes"]
        rows.append((name, cfg.num_env_groups, envs, f"{slow_envs / envs:.0%}", mean[name], max(fills),
                     total["straggler_groups"], total["aborted"], total["groups_started"], total["groups_put"],
                     total["stale_cancelled"]))
    ratio = mean["without"] / mean["with"]
    print(f"batch = {gpb} groups x {args.group_size}; fast step N({args.mean_s:g}, {0.4 * args.mean_s:g}), "
          f"stragglers {SLOWDOWN:.0f}x; {episode_len} turns; async_ratio={args.async_ratio}; "
          f"{rounds} rounds x {batches} batches per variant")
    print(table(rows, ("redundancy", "lanes", "envs", "straggler envs", "mean fill s", "max fill s",
                       "straggler groups used", "episodes aborted", "groups started", "put", "stale-cancelled")))
    for name, n in lost.items():
        if n > 0:  # neither put, nor cancelled as stale, nor possibly in flight at the end
            print(f"note ({name}): at least {n} groups were started and then discarded without being stale")
    print(f"with redundancy: batches fill {ratio:.2f}x faster")
    print(result_line(ratio=ratio, with_s=mean["with"], without_s=mean["without"]))


if __name__ == "__main__":
    main()
