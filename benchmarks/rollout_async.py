"""Synchronous batch rollout vs environment-level async rollout (ROLL Flash, mu = sigma).

Simulated env with step latency N(mu, sigma = mu) clipped at 0 (ROLL Flash's 10 s
setting scaled to 50 ms), multi-turn episodes of 5..10 turns, scripted engine at
1 ms/token. Both variants use the same number of env instances and episodes:

- sync: every env of a batch steps in lockstep -- generate for all (concurrently,
  through the proxy), step all (concurrently), wait for ALL, next turn; the batch
  ends when its last episode ends. Written here: it is the comparison point.
- async: the real GroupScheduler + EnvManagers + SampleBuffer (async ratio large
  enough that admission never binds, zero training time): each env starts its
  next episode as soon as its last one ended.

The ideal bound is E[sync batch time] / E[episode time], by Monte Carlo over the
env's own latency sampler and episode-length rule.
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

from benchmarks.common import (build_stack, consume, make_formatter, result_line, scripted_engines, sim_spec,  # noqa: E402
                               table)
from roll_agent.proxy.llm_proxy import LLMProxy  # noqa: E402
from envs.simulated import SimulatedEnv  # noqa: E402
from roll_agent.config import RolloutConfig, ScriptedEngineConfig  # noqa: E402
from roll_agent.env_registry import make_env  # noqa: E402
from roll_agent.types import GenerateRequest, SamplingParams, Trajectory  # noqa: E402


async def sync_batch(proxy, formatter, envs, seeds, cfg: RolloutConfig) -> list[Trajectory]:
    """One lockstep batch, mirroring EnvManager._play's per-turn work but with a barrier per turn."""
    trajs = []
    for i, (env, seed) in enumerate(zip(envs, seeds)):
        obs, info = env.reset(seed=seed)  # instant for the simulated env
        traj = Trajectory(env_id=f"sync-{i}", seed=seed, start_version=proxy.version)
        traj.append(formatter.first_prompt(str(info.get("instructions", "")), str(obs)), generated=False)
        trajs.append(traj)
    active = list(range(len(envs)))
    for _ in range(cfg.max_turns):
        active = [i for i in active if cfg.max_context_tokens - len(trajs[i].token_ids) > 0]
        if not active:
            break

        def request(i):
            budget = min(cfg.max_new_tokens, cfg.max_context_tokens - len(trajs[i].token_ids))
            sampling = SamplingParams(max_new_tokens=budget, temperature=cfg.temperature, top_p=cfg.top_p,
                                      stop_token_ids=formatter.stop_token_ids)
            return proxy.generate(GenerateRequest(list(trajs[i].token_ids), sampling, trajs[i].env_id))

        results = await asyncio.gather(*(request(i) for i in active))  # barrier 1: all generations
        for i, r in zip(active, results):
            trajs[i].append(r.token_ids, generated=True, logprobs=r.logprobs, versions=r.versions)
            trajs[i].num_turns += 1
        steps = await asyncio.gather(*(envs[i].unwrapped.astep(formatter.response_text(r.token_ids))
                                       for i, r in zip(active, results)))  # barrier 2: all env steps
        still = []
        for i, r, (obs, reward, terminated, truncated, _) in zip(active, results, steps):
            trajs[i].step_rewards.append(float(reward))
            if not (terminated or truncated):
                trajs[i].append(formatter.next_turn(str(obs), r.finish_reason == "stop"), generated=False)
                still.append(i)
        active = still
    return trajs


async def run_sync(formatter, spec, engine_cfg, cfg, n, batches, seed) -> tuple[float, int]:
    """Returns (seconds, env steps of the finished episodes)."""
    proxy = LLMProxy(scripted_engines(engine_cfg))
    envs = [make_env(spec) for _ in range(n)]
    rng = random.Random(seed)
    steps = 0
    start = time.perf_counter()
    for _ in range(batches):
        trajs = await sync_batch(proxy, formatter, envs, [rng.randrange(1_000_000) for _ in range(n)], cfg)
        steps += sum(t.num_turns for t in trajs)
    elapsed = time.perf_counter() - start
    for env in envs:
        env.close()
    return elapsed, steps


async def run_async(formatter, spec, engine_cfg, cfg, batches) -> tuple[float, int, float]:
    """Returns (seconds, env steps of the consumed episodes, mean generated tokens per request)."""
    stack = build_stack(formatter, cfg, [spec], engine_cfg)
    steps = []
    seconds, _ = await consume(stack, batches, lambda v, batch: steps.extend(
        t.num_turns for g in batch for t in g.trajectories))
    return seconds, sum(steps), stack.proxy.stats["gen_tokens"] / max(1, stack.proxy.stats["requests"])


def ideal_bound(env_kwargs: dict, n: int, gen_s: float, trials: int = 4000, seed: int = 0) -> float:
    """E[lockstep batch time] / E[one episode's time] for n independent envs; each turn
    costs gen_s plus the env's latency (the env's own sampler, clipping included)."""
    env = SimulatedEnv(**env_kwargs)
    rng = random.Random(seed)
    batch_t, episode_t = [], []
    for _ in range(trials):
        lens = [rng.randint(env.min_len, env.episode_len) for _ in range(n)]
        lat = [[env.sample_latency(rng) + gen_s for _ in range(length)] for length in lens]
        batch_t.append(sum(max(x[t] for x in lat if len(x) > t) for t in range(max(lens))))
        episode_t.extend(sum(x) for x in lat)
    return statistics.fmean(batch_t) / statistics.fmean(episode_t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized run (< 30 s)")
    ap.add_argument("--envs", type=int, default=None)
    ap.add_argument("--batches", type=int, default=None, help="batches of `envs` episodes per variant and round")
    ap.add_argument("--rounds", type=int, default=None, help="sync/async rounds, interleaved against drift")
    ap.add_argument("--mu", type=float, default=0.05, help="mean (= std) step latency, seconds")
    args = ap.parse_args()
    n = args.envs or (16 if args.quick else 32)
    batches = args.batches or (3 if args.quick else 6)
    rounds = args.rounds or (1 if args.quick else 2)

    env_kwargs = dict(latency="normal", mean_s=args.mu, std_s=args.mu, episode_len=10, min_len=5)
    spec = sim_spec(**env_kwargs)
    engine_cfg = ScriptedEngineConfig(response_tokens=4, token_latency_s=0.001)
    # group_size 1: every env plays its own task, as in the sync batch (the simulated env's
    # latency is a function of the task seed, so envs sharing a seed would step in lockstep)
    cfg = RolloutConfig(async_ratio=1_000_000, num_env_groups=n, groups_per_batch=n, group_size=1,
                        group_size_redundancy=0, max_turns=10, max_new_tokens=8)
    formatter = make_formatter()

    sync_s = async_s = 0.0
    sync_steps = async_steps = 0
    tokens = []
    for r in range(rounds):
        seconds, steps = asyncio.run(run_sync(formatter, spec, engine_cfg, cfg, n, batches, seed=r))
        sync_s, sync_steps = sync_s + seconds, sync_steps + steps
        seconds, steps, tok = asyncio.run(run_async(formatter, spec, engine_cfg, cfg, batches))
        async_s, async_steps = async_s + seconds, async_steps + steps
        tokens.append(tok)
    episodes = rounds * batches * n
    sync_eps, async_eps = episodes / sync_s, episodes / async_s
    ratio = async_eps / sync_eps
    bound = ideal_bound(env_kwargs, n, gen_s=0.0)
    bound_gen = ideal_bound(env_kwargs, n, gen_s=statistics.fmean(tokens) * engine_cfg.token_latency_s)

    print(f"envs={n} episodes/variant={episodes} step latency N({args.mu}, {args.mu}) clipped at 0, "
          f"5..10 turns, {engine_cfg.token_latency_s * 1e3:.0f} ms/token, {statistics.fmean(tokens):.1f} tokens/turn")
    # env steps/s as well: async finishes short episodes more often, steps/s is not biased by that
    print(table([("sync (lockstep batches)", sync_s, sync_eps, 1.0, sync_steps / sync_s, 1.0),
                 ("async (env-level, real stack)", async_s, async_eps, ratio, async_steps / async_s,
                  (async_steps / async_s) / (sync_steps / sync_s))],
                ("variant", "seconds", "episodes/s", "x sync", "env steps/s", "x sync")))
    print(f"ideal bound: {bound:.2f}x (env latency only), {bound_gen:.2f}x (incl. generation time); "
          f"achieved {ratio / bound_gen:.0%} of the latter")
    print(result_line(ratio=ratio, bound=bound, sync_eps=sync_eps, async_eps=async_eps))


if __name__ == "__main__":
    main()
