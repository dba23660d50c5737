"""Scale in simulation: the real rollout stack (LLMProxy, EnvManagers, GroupScheduler, groups,
SampleBuffer and its admission) at sizes this machine cannot run, on a virtual clock
(benchmarks/virtual_clock.py): env steps, generation and training wait in virtual seconds,
so hours of a large run's waiting pass in seconds; the stack's own CPU work is real.

Three checks, each against the setting the ROLL Flash paper reports:
1. bound: 10,000 envs x 128 scripted engines, async ratio 2, a trainer that takes
   `--train-s` per step: no trained token is more than `async_ratio` versions older than
   the step that trains it (`bound_violations`), nor from the future.
2. env-level async vs lockstep (the paper's 2.46x at mu = sigma = 10 s): the same envs
   play the same number of episodes in lockstep batches (every env waits for the slowest
   at each turn, benchmarks/rollout_async.py's `sync_batch`) and with the real stack
   (each env starts its next episode as soon as its last ended).
3. redundancy (the paper's 5.45x at 36 groups x 12): 32 groups of 8 make a batch; 10% of
   episodes, in any env, straggle (every step 10x slower, drawn per episode). Without
   redundancy: 32 lanes of 8; with: 36 lanes of 8 + 4 redundant envs. Async ratio 0, so
   each batch's fill time is what a straggler inflates. Also printed: the share of
   straggling episodes that still reach a batch (the bias redundancy trades for speed).

Not simulated: engine capacity (a scripted engine serves any number of requests at once,
each `--gen-s`), the trainer (a sleep), the real network and GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (build_stack, make_formatter, result_line, scripted_engines, sim_spec,  # noqa: E402
                               table)
from benchmarks.rollout_async import ideal_bound, sync_batch  # noqa: E402
from benchmarks.virtual_clock import VirtualClockLoop  # noqa: E402
from roll_agent.config import RolloutConfig, ScriptedEngineConfig  # noqa: E402
from roll_agent.controller import update_weights  # noqa: E402
from roll_agent.proxy.llm_proxy import LLMProxy  # noqa: E402
from roll_agent.env_registry import make_env  # noqa: E402

PAPER = {"env_async": 2.46, "redundancy": 5.45}


def virtual(coro_fn, *args):
    """Run `coro_fn(*args)` on a virtual clock: (its result, real seconds it took)."""
    start = time.perf_counter()
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        out = runner.run(coro_fn(*args))
    return out, time.perf_counter() - start


async def train(stack, batches: int, train_s: float, async_ratio: int, on_batch=None) -> dict:
    """Play the trainer: take `batches` batches, each followed by `train_s` of training and a
    weight sync. Checks every trained token against the async-ratio bound."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    fills, violations, samples, stale_max = [], 0, 0, 0
    stack.scheduler.start()
    try:
        for v in range(batches):
            ready = loop.time()
            batch = await stack.buffer.get_batch(v)
            fills.append(loop.time() - ready)
            if on_batch is not None:
                on_batch(batch)
            for group in batch:
                for traj in group.trajectories:
                    versions = [ver for ver, m in zip(traj.versions, traj.loss_mask) if m]
                    samples += 1
                    stale_max = max(stale_max, v - min(versions))
                    violations += v - min(versions) > async_ratio or max(versions) > v
            await asyncio.sleep(train_s)
            await update_weights(stack, v + 1)
        return {"sim_s": loop.time() - start, "fills": fills, "violations": violations, "samples": samples,
                "staleness_max": stale_max, "episodes_started": stack.buffer.ledger.counts["started"]}
    finally:
        await stack.close()


async def lockstep(formatter, spec, engine_cfg, cfg: RolloutConfig, n: int, batches: int, engines: int) -> float:
    """Virtual seconds for `batches` lockstep batches of `n` episodes."""
    loop = asyncio.get_running_loop()
    proxy = LLMProxy(scripted_engines(engine_cfg, engines))
    envs = [make_env(spec) for _ in range(n)]
    rng = random.Random(0)
    start = loop.time()
    for _ in range(batches):
        await sync_batch(proxy, formatter, envs, [rng.randrange(1_000_000) for _ in range(n)], cfg)
    elapsed = loop.time() - start
    for env in envs:
        env.close()
    return elapsed


async def env_level(formatter, spec, engine_cfg, cfg: RolloutConfig, batches: int, engines: int) -> float:
    stack = build_stack(formatter, cfg, [spec], engine_cfg, num_engines=engines)
    return (await train(stack, batches, 0.0, cfg.async_ratio))["sim_s"]


async def redundancy_arm(formatter, cfg: RolloutConfig, spec, engine_cfg, batches: int, engines: int) -> dict:
    stack = build_stack(formatter, cfg, [spec], engine_cfg, num_engines=engines)
    trained = []  # per trained episode: did it straggle

    def count(batch):
        trained.extend(bool(t.info.get("straggling")) for g in batch for t in g.trajectories)

    out = await train(stack, batches + 1, 0.0, cfg.async_ratio, on_batch=count)
    out["fills"] = out["fills"][1:]  # the first batch also makes every env
    return {**out, "trained": sum(trained), "trained_of": len(trained)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized: 400 envs x 8 engines, 2 batches an arm")
    ap.add_argument("--envs", type=int, default=10_000)
    ap.add_argument("--engines", type=int, default=128)
    ap.add_argument("--mu", type=float, default=10.0, help="mean (= std) env step latency, virtual seconds")
    ap.add_argument("--gen-s", type=float, default=2.0, help="one generation, virtual seconds")
    ap.add_argument("--train-s", type=float, default=120.0, help="one training step, virtual seconds")
    ap.add_argument("--batches", type=int, default=None)
    args = ap.parse_args()
    envs, engines = (400, 8) if args.quick else (args.envs, args.engines)
    batches = args.batches or (2 if args.quick else 5)
    formatter = make_formatter()
    engine_cfg = ScriptedEngineConfig(response_tokens=4, latency_s=args.gen_s)
    env_kwargs = dict(latency="normal", mean_s=args.mu, std_s=args.mu, episode_len=10, min_len=5)
    # virtual hours: no step or episode hits a timeout (a straggling step takes ~100 s)
    patience = dict(step_timeout_s=1e6, episode_timeout_s=1e7)
    turns = dict(max_turns=10, max_new_tokens=8, **patience)
    real_total, sim_total = 0.0, 0.0

    # 1. the async-ratio bound at full size: groups of 8, a batch a quarter of the envs' groups
    groups = envs // 8
    cfg = RolloutConfig(async_ratio=2, num_env_groups=groups, groups_per_batch=max(1, groups // 4), group_size=8,
                        group_size_redundancy=0, **turns)
    bound, real = virtual(lambda: train(build_stack(formatter, cfg, [sim_spec(**env_kwargs)], engine_cfg,
                                                    num_engines=engines), batches, args.train_s, cfg.async_ratio))
    real_total, sim_total = real_total + real, sim_total + bound["sim_s"]
    print(f"1. bound: {envs:,} envs ({groups} groups of 8), {engines} engines, async ratio 2, "
          f"{cfg.groups_per_batch} groups a batch, training {args.train_s:g} s a step: {bound['samples']:,} samples "
          f"trained in {batches} steps, staleness max {bound['staleness_max']}, violations {bound['violations']}; "
          f"{bound['sim_s']:,.0f} simulated s in {real:.1f} real s")

    # 2. env-level async vs lockstep, ROLL Flash's mu = sigma setting; every env its own task
    n = min(envs, 1024)
    cfg = RolloutConfig(async_ratio=1_000_000, num_env_groups=n, groups_per_batch=n, group_size=1,
                        group_size_redundancy=0, **turns)
    spec = sim_spec(**env_kwargs)
    sync_s, real_a = virtual(lockstep, formatter, spec, engine_cfg, cfg, n, batches, engines)
    async_s, real_b = virtual(env_level, formatter, spec, engine_cfg, cfg, batches, engines)
    env_async_ratio = sync_s / async_s
    ideal = ideal_bound(env_kwargs, n, gen_s=args.gen_s, trials=max(20, 100_000 // n))
    real_total, sim_total = real_total + real_a + real_b, sim_total + sync_s + async_s
    print(table([("lockstep batches", sync_s, n * batches / sync_s, 1.0),
                 ("env-level async (real stack)", async_s, n * batches / async_s, env_async_ratio)],
                ("2. mu = sigma = %gs, %d envs" % (args.mu, n), "sim seconds", "episodes/sim s", "x lockstep")))
    print(f"   ideal bound {ideal:.2f}x; paper {PAPER['env_async']}x")

    # 3. redundancy against per-episode stragglers: 32 groups of 8 a batch
    strag = dict(latency="normal", mean_s=args.mu, std_s=0.4 * args.mu, episode_len=5, min_len=5,
                 straggler_prob=0.1, tail_scale=10.0)
    base = dict(async_ratio=0, groups_per_batch=32, group_size=8, max_turns=5, max_new_tokens=8, **patience)
    arms = {"32 x 8 (none)": RolloutConfig(num_env_groups=32, group_size_redundancy=0, **base),
            "36 x 12 (redundant)": RolloutConfig(num_env_groups=36, group_size_redundancy=4, **base)}
    rows, fill = [], {}
    for name, arm in arms.items():
        out, real = virtual(redundancy_arm, formatter, arm, sim_spec(**strag), engine_cfg, batches, engines)
        real_total, sim_total = real_total + real, sim_total + out["sim_s"]
        fill[name] = statistics.fmean(out["fills"])
        rows.append((name, arm.num_env_groups * (arm.group_size + arm.group_size_redundancy), fill[name],
                     f"{out['trained'] / max(1, out['trained_of']):.1%}"))
    redundancy_ratio = fill["32 x 8 (none)"] / fill["36 x 12 (redundant)"]
    print(table(rows, ("3. 10% of episodes straggle 10x", "envs", "batch fill, sim s", "straggling share trained")))
    print(f"   redundancy {redundancy_ratio:.2f}x faster batches; paper {PAPER['redundancy']}x "
          f"(10% of episodes straggle: a share trained below 10% is the bias redundancy trades for speed)")
    print(f"{sim_total:,.0f} simulated s in {real_total:.0f} real s: {sim_total / real_total:,.0f} simulated s per real s")
    print(result_line(env_async_ratio=env_async_ratio, redundancy_ratio=redundancy_ratio,
                      bound_violations=bound["violations"], envs=envs, engines=engines,
                      staleness_max=bound["staleness_max"], env_async_ideal=ideal,
                      sim_s_per_real_s=sim_total / real_total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
