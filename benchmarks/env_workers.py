"""ALFWorld and TextWorld envs: worker processes vs the thread pool and its engine lock.

N envs (default 32) of each family play a fixed script, the same in both arms: every env
resets (seed = its index + 1000 * round), then takes `--steps` steps, each the admissible
action at index (step * 7 + env) mod their count; `--rounds` times. Resets are timed as one
phase (all envs at once), steps as another, so resets/s and steps/s are separate figures.

    threads  the envs in this process, each call through a thread pool of
             rollout.env_threads threads (how an EnvManager runs a blocking env); TextWorld's
             and ALFWorld's engine calls take their process-wide ENGINE_LOCK
    workers  the same envs in env worker processes (roll_agent/rollout/env_workers.py) at
             their default count (the CPU count), driven as an EnvManager drives them

Games: ALFWorld's shipped game plus the tasks `python -m envs.alfworld_env generate` makes
from its scene (generated once into the cache); TextWorld cooking games of seeds 0..rounds*N-1
(generated once into the TextWorld cache). Generation is not timed. Each arm first gets
ready, timed apart as "start-up": the threads arm warms its engine up in this process (the env's
`warm_up()`: imports, TextWorld's logic parse), the workers arm starts its worker processes,
which warm up as they start (`EnvWorkers.start`, what a run does while its model loads:
roll_agent/runtime/local.py). Then the first round's resets make each env and load its first
game ("first resets"); later rounds load the next game.
Each arm runs in a fresh process, so a crash (the segfault TextWorld's engines can give
under threads) ends only that arm, and is reported.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/env_workers.py [--envs 32 --steps 8 --rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import result_line  # noqa: E402
from roll_agent.config import EnvSpec, RolloutConfig  # noqa: E402
from roll_agent.rollout.env_workers import EnvWorkers, num_workers, warm_up  # noqa: E402
from roll_agent.env_registry import make_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHIPPED_ALFWORLD = REPO.parent / "shared" / "data" / "alfworld"
COOKING = {"recipe": 1, "take": 1, "go": 1}


def cache_root() -> Path:
    return Path(os.environ.get("ROLL_AGENT_CACHE") or Path.home() / ".cache" / "roll_agent")


def alfworld_data(source: Path) -> Path:
    """The shipped game and the tasks `generate` makes from its scene, in one data dir."""
    from envs.alfworld_env import generate

    out = cache_root() / "bench" / "alfworld-generated"
    if not (out / "json_2.1.1").is_dir():
        t0 = time.perf_counter()
        generate(source, out, new_tasks=5, log=lambda _: None)
        print(f"generated ALFWorld tasks into {out} ({time.perf_counter() - t0:.0f}s)", flush=True)
    return out


def cooking_games(n: int) -> None:
    from envs.textworld_env import main

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the paths, one per game
        main(["generate", "--challenge", "tw-cooking", "--seeds", f"0-{n - 1}", *(f"{k}={v}" for k, v in COOKING.items())])
    print(f"{n} cooking games ready ({time.perf_counter() - t0:.0f}s)", flush=True)


def action(info: dict, env: int, step: int) -> str:
    admissible = sorted(info.get("admissible_actions") or [])
    if not admissible:  # every state of these games lists some: the engine is broken
        raise RuntimeError(f"env {env} step {step}: the game lists no admissible action")
    return admissible[(step * 7 + env) % len(admissible)]


class ThreadArm:
    """Envs in this process, called through a thread pool."""

    def __init__(self, spec: EnvSpec, threads: int):
        self.spec, self.pool = spec, ThreadPoolExecutor(threads, thread_name_prefix="env")

    async def start(self):
        warm_up(self.spec)

    async def make(self):
        return await asyncio.get_running_loop().run_in_executor(self.pool, make_env, self.spec)

    async def reset(self, env, seed):
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: env.reset(seed=seed))

    async def step(self, env, act):
        return await asyncio.get_running_loop().run_in_executor(self.pool, env.step, act)

    def close(self, envs):
        for env in envs:
            env.close()
        self.pool.shutdown()


class WorkerArm:
    """The same envs in env worker processes."""

    def __init__(self, spec: EnvSpec):
        self.spec, self.workers = spec, EnvWorkers()

    async def start(self):
        await self.workers.pool(self.spec).warm(self.spec)

    async def make(self):
        return await self.workers.pool(self.spec).make(self.spec)

    async def reset(self, env, seed):
        return await env.areset(seed=seed)

    async def step(self, env, act):
        return await env.astep(act)

    def close(self, envs):
        for env in envs:
            env.close()
        self.workers.close()


async def play(arm, n: int, steps: int, rounds: int) -> dict:
    envs = [None] * n
    reset_s, step_s = [], 0.0
    transcript = []
    t0 = time.perf_counter()
    await arm.start()
    start_s = time.perf_counter() - t0
    try:
        for r in range(rounds):
            async def reset_one(i):
                if envs[i] is None:
                    envs[i] = await arm.make()
                return (await arm.reset(envs[i], i + 1000 * r))[1]

            t0 = time.perf_counter()
            infos = await asyncio.gather(*(reset_one(i) for i in range(n)))
            reset_s.append(time.perf_counter() - t0)

            async def steps_of(i):
                info, seen = infos[i], []
                for s in range(steps):
                    obs, reward, terminated, truncated, info = await arm.step(envs[i], action(info, i, s))
                    seen.append((obs, reward))
                    if terminated or truncated:
                        break
                return seen

            t0 = time.perf_counter()
            transcript += await asyncio.gather(*(steps_of(i) for i in range(n)))
            step_s += time.perf_counter() - t0
    finally:
        arm.close([e for e in envs if e is not None])
    n_steps = sum(len(t) for t in transcript)
    warm = sum(reset_s[1:])
    return {"cold_resets_per_s": n / reset_s[0], "warm_resets_per_s": n * (rounds - 1) / warm if warm else 0.0,
            "steps_per_s": n_steps / step_s, "cold_reset_s": reset_s[0], "warm_reset_s": warm,
            "step_s": step_s, "steps": n_steps, "start_s": start_s, "transcript": transcript}


def run_arm(args) -> int:
    """One arm of one family in this process (a fresh one per arm: a crash ends only its arm)."""
    spec = family_spec(args.family, args)
    arm = ThreadArm(spec, RolloutConfig().env_threads) if args.arm == "threads" else WorkerArm(spec)
    res = asyncio.run(play(arm, args.envs, args.steps, args.rounds))
    digest = hashlib.sha256(repr(res.pop("transcript")).encode()).hexdigest()
    print("ARM " + json.dumps({**res, "transcript_sha": digest}), flush=True)
    return 0


def family_spec(family: str, args) -> EnvSpec:
    if family == "alfworld":
        return EnvSpec(id="roll_agent/ALFWorld-v0", kwargs={"data_dir": str(alfworld_data(args.alfworld_data))})
    return EnvSpec(id="roll_agent/TWCooking-v0", kwargs={"settings": COOKING, "num_games": args.envs * args.rounds})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--alfworld-data", type=Path, default=SHIPPED_ALFWORLD)
    parser.add_argument("--families", default="alfworld,textworld")
    parser.add_argument("--family", help=argparse.SUPPRESS)  # with --arm: one arm in this process
    parser.add_argument("--arm", choices=("threads", "workers"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        return run_arm(args)

    families = args.families.split(",")
    if "alfworld" in families:
        alfworld_data(args.alfworld_data)
    if "textworld" in families:
        cooking_games(args.envs * args.rounds)
    threads = RolloutConfig().env_threads
    figures: dict = {}
    for family in families:
        workers = num_workers(family_spec(family, args))
        print(f"{family}: {args.envs} envs, {args.steps} steps x {args.rounds} rounds; "
              f"threads arm {threads} threads, workers arm {workers} worker processes", flush=True)
        results = {}
        for name in ("threads", "workers"):
            argv = [sys.executable, __file__, "--arm", name, "--family", family, "--envs", str(args.envs),
                    "--steps", str(args.steps), "--rounds", str(args.rounds), "--alfworld-data", str(args.alfworld_data)]
            done = subprocess.run(argv, capture_output=True, text=True)
            line = [ln for ln in done.stdout.splitlines() if ln.startswith("ARM ")]
            if done.returncode != 0 or not line:
                print(f"  {name:8s} FAILED (exit code {done.returncode}): {done.stderr.strip()[-600:]}", flush=True)
                results[name] = None
                continue
            results[name] = res = json.loads(line[0][4:])
            print(f"  {name:8s} start-up {res['start_s']:4.1f}s   "
                  f"first resets/s {res['cold_resets_per_s']:6.2f} ({res['cold_reset_s']:5.1f}s)   "
                  f"later resets/s {res['warm_resets_per_s']:6.2f} ({res['warm_reset_s']:5.1f}s)   "
                  f"steps/s {res['steps_per_s']:6.1f} ({res['step_s']:5.1f}s, {res['steps']} steps)", flush=True)
        figures[f"{family}_threads_crashed"] = int(results["threads"] is None)
        if results["threads"] and results["workers"]:
            threads_res, workers_res = results["threads"], results["workers"]
            figures[f"{family}_steps_ratio"] = workers_res["steps_per_s"] / threads_res["steps_per_s"]
            for kind in ("cold", "warm"):
                figures[f"{family}_{kind}_resets_ratio"] = (workers_res[f"{kind}_resets_per_s"]
                                                            / threads_res[f"{kind}_resets_per_s"])
            figures[f"{family}_same_transcripts"] = int(threads_res["transcript_sha"] == workers_res["transcript_sha"])
            print(f"  workers/threads: steps/s {figures[f'{family}_steps_ratio']:.2f}x, first resets/s "
                  f"{figures[f'{family}_cold_resets_ratio']:.2f}x, later resets/s "
                  f"{figures[f'{family}_warm_resets_ratio']:.2f}x; "
                  f"same transcripts: {bool(figures[f'{family}_same_transcripts'])}", flush=True)
    print(result_line(cores=os.cpu_count(), **figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
