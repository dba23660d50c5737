"""Time to fill a batch when 10% of episodes straggle (every step 10x slower), with and without
redundant envs, at the default run's topology and at a tuned one, in one run.

Stragglers come as they do in a real run: any episode of any env may straggle, drawn per
episode (the simulated env's `straggler_prob`), not whole lanes that are always slow. Arms:
- none:    the batch's groups exactly, no redundant env (the comparison point);
- default: the topology of configs/default.yaml (as many groups as a batch takes, each with
           `group_size_redundancy` extra envs: a group completes when `group_size` of its
           envs have);
- tuned:   1.5x as many groups as a batch takes, plus the default's redundant envs.
Each arm's batch is `groups_per_batch` groups of `group_size` (the default run's 8 x 8).

Redundancy buys speed by training less on what straggles: the table shows, per arm, the share
of trained episodes that straggled (10% when nothing is dropped; lower is the bias
docs/performance.md notes under rollout_redundancy). Async ratio 0 (on-policy): every batch
is generated from scratch after the previous step, so its fill time is what a straggler
inflates. The real stack plays with zero training time; the first batch (env construction)
is not averaged.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import build_stack, consume, make_formatter, result_line, sim_spec, table  # noqa: E402
from roll_agent.config import RolloutConfig, ScriptedEngineConfig  # noqa: E402
from roll_agent.config_loader import load_config  # noqa: E402

STRAGGLER_SHARE = 0.1
SLOWDOWN = 10.0


async def run_arm(formatter, cfg: RolloutConfig, spec, engine_cfg, batches: int) -> dict:
    stack = build_stack(formatter, cfg, [spec], engine_cfg)
    trained = []
    _, fills = await consume(stack, batches + 1, lambda v, batch: trained.extend(
        bool(t.info.get("straggling")) for g in batch for t in g.trajectories))
    return {"fills": fills[1:], "trained": len(trained), "straggling_trained": sum(trained),
            "cancelled": stack.buffer.ledger.counts["cancelled"]}


def arms(default: RolloutConfig, async_ratio: int, turns: int) -> dict[str, RolloutConfig]:
    """The default run's rollout section as it is, without its redundant envs, and with 1.5x its groups."""
    default = dataclasses.replace(default, async_ratio=async_ratio, max_turns=turns, max_new_tokens=8)
    return {"none": dataclasses.replace(default, group_size_redundancy=0),
            "default": default,
            "tuned": dataclasses.replace(default, num_env_groups=round(1.5 * default.groups_per_batch))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized run (< 30 s)")
    ap.add_argument("--batches", type=int, default=None, help="averaged batches per arm and round")
    ap.add_argument("--rounds", type=int, default=None, help="rounds, arms interleaved against drift")
    ap.add_argument("--async-ratio", type=int, default=0)
    ap.add_argument("--mean-s", type=float, default=0.05, help="mean step latency of an episode that does not straggle")
    args = ap.parse_args()
    batches = args.batches or (2 if args.quick else 6)
    rounds = args.rounds or (1 if args.quick else 2)
    default = load_config(None).rollout  # configs/default.yaml: 8 groups of 8 (+1) for 8-group batches
    turns = 5
    configs = arms(default, args.async_ratio, turns)
    spec = sim_spec(latency="normal", mean_s=args.mean_s, std_s=0.4 * args.mean_s, episode_len=turns,
                    straggler_prob=STRAGGLER_SHARE, tail_scale=SLOWDOWN)
    engine_cfg = ScriptedEngineConfig(response_tokens=4, token_latency_s=0.001)
    formatter = make_formatter()

    results = {name: [] for name in configs}
    for _ in range(rounds):
        for name, cfg in configs.items():
            results[name].append(asyncio.run(run_arm(formatter, cfg, spec, engine_cfg, batches)))

    rows, mean, share = [], {}, {}
    for name, cfg in configs.items():
        fills = [f for r in results[name] for f in r["fills"]]
        mean[name] = statistics.fmean(fills)
        trained = sum(r["trained"] for r in results[name])
        share[name] = sum(r["straggling_trained"] for r in results[name]) / trained
        rows.append((name, cfg.num_env_groups, cfg.group_size + cfg.group_size_redundancy,
                     cfg.num_env_groups * (cfg.group_size + cfg.group_size_redundancy), mean[name], max(fills),
                     mean["none"] / mean[name], f"{share[name]:.1%}", sum(r["cancelled"] for r in results[name])))
    print(f"batch = {default.groups_per_batch} groups x {default.group_size}; step N({args.mean_s:g}, "
          f"{0.4 * args.mean_s:g}) s, {STRAGGLER_SHARE:.0%} of episodes {SLOWDOWN:.0f}x slower; {turns} turns; "
          f"async_ratio={args.async_ratio}; {rounds} rounds x {batches} batches per arm")
    print(table(rows, ("arm", "groups", "envs/group", "envs", "mean fill s", "max fill s", "x none",
                       "straggling share trained", "episodes cancelled")))
    print(f"the default topology fills batches {mean['none'] / mean['default']:.2f}x faster than none, the tuned "
          f"one {mean['none'] / mean['tuned']:.2f}x; straggling episodes are {STRAGGLER_SHARE:.0%} of those played")
    print(result_line(ratio=mean["none"] / mean["default"], tuned_ratio=mean["none"] / mean["tuned"],
                      straggling_trained_none=share["none"], straggling_trained_default=share["default"],
                      straggling_trained_tuned=share["tuned"], none_s=mean["none"], default_s=mean["default"],
                      tuned_s=mean["tuned"]))


if __name__ == "__main__":
    main()
