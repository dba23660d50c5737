"""Turn-level credit vs episode-level: `grpo` vs `turn` vs `gigpo`, the same seeds, several runs each.

Each run is `python -m roll_agent.run` as a user runs it (configs/default.yaml), one process at a
time, with only `seed`, `algorithm.advantage` and the env's settings given: on the default
FrozenLake, and on Sokoban (longer episodes, harder credit: `SOKOBAN` below). The estimators of
one seed run back to back (grpo, turn, gigpo; then the next seed), so machine noise falls on all
three alike. Reported per env and estimator: greedy evaluation on the held-out seeds after the
warm-start (step 0) and at the end (mean and standard error over the runs), the RL steps until
the evaluation first reached 0.6 (FrozenLake; evaluations every `eval.every` steps, so a multiple
of it; runs that never did are counted apart), and the wall time of a run.

    python benchmarks/credit.py                      # 5 runs each, both envs (about 3 hours on 2 cores)
    python benchmarks/credit.py --runs 2 --envs frozenlake --estimators grpo gigpo

The last line is `RESULT frozenlake_grpo=... frozenlake_gigpo=... frozenlake_turn=... sokoban_grpo=...
sokoban_gigpo=... sokoban_turn=... runs=N` (final greedy eval means). Every run's metrics stay in
--out (a temporary folder unless given); `--summary FILE` also writes the per-run numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import result_line, table  # noqa: E402

ESTIMATORS = ("grpo", "turn", "gigpo")
# Sokoban: one box in a 6x6 room (4x4 inside the walls), up to 16 moves; the warm-start and RL
# steps as the default run's. Everything else is configs/default.yaml.
SOKOBAN = ["envs=[{id: roll_agent/Sokoban-v0, kwargs: {dim: 6, num_boxes: 1, invalid_action_penalty: -0.1}}]",
           "rollout.max_turns=16", "rollout.max_context_tokens=2048", "model.tiny.max_position_embeddings=2048"]
ENVS = {"frozenlake": [], "sokoban": SOKOBAN}
REACH = 0.6  # FrozenLake: steps until the greedy evaluation first reaches this


def run_one(out: Path, env: str, estimator: str, seed: int, extra: list[str]) -> dict:
    """One `python -m roll_agent.run`; its evaluations and wall time."""
    run_dir = out / f"{env}-{estimator}-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a run's metrics.jsonl is appended to: start it empty
    cmd = [sys.executable, "-m", "roll_agent.run", f"output_dir={run_dir}", f"seed={seed}",
           f"algorithm.advantage={estimator}", "logging.progress=false", "logging.backends=[jsonl]",
           "logging.plot=false", *ENVS[env], *extra]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = {r["step"]: r["eval_success_rate"] for r in rows if "eval_success_rate" in r}
    steps = sorted(evals)
    reached = next((s for s in steps if evals[s] >= REACH), None)
    return {"env": env, "estimator": estimator, "seed": seed, "warm_start": evals[steps[0]],
            "final": evals[steps[-1]], "min_after_start": min(evals[s] for s in steps[1:]),
            "reached_step": reached, "evals": evals, "seconds": seconds}


def mean_se(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, float("nan")
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--summary", type=Path, default=None, help="write every run's numbers here (JSON)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs --summary already holds (same env, estimator, seed) and run the rest")
    parser.add_argument("overrides", nargs="*", help="more config overrides for every run (key=value)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="credit-"))
    kept = json.loads(args.summary.read_text()) if args.resume and args.summary and args.summary.exists() else []
    runs = []
    for env in args.envs:
        for seed in range(args.first_seed, args.first_seed + args.runs):
            for estimator in args.estimators:
                done = [r for r in kept if (r["env"], r["estimator"], r["seed"]) == (env, estimator, seed)]
                if done:
                    runs.append(done[0])
                    continue
                r = run_one(out, env, estimator, seed, args.overrides)
                runs.append(r)
                print(f"{env} {estimator} seed {seed}: warm-start {r['warm_start']:.3f} -> final {r['final']:.3f} "
                      f"(lowest after start {r['min_after_start']:.3f}), {r['seconds']:.0f} s", flush=True)
                if args.summary:
                    args.summary.write_text(json.dumps(runs + [k for k in kept if k not in runs], indent=1))
    rows, result = [], {}
    for env in args.envs:
        for estimator in args.estimators:
            these = [r for r in runs if r["env"] == env and r["estimator"] == estimator]
            warm, warm_se = mean_se([r["warm_start"] for r in these])
            final, final_se = mean_se([r["final"] for r in these])
            reached = [r["reached_step"] for r in these if r["reached_step"] is not None]
            to_reach = f"{sum(reached) / len(reached):.0f} ({len(reached)}/{len(these)})" if reached else \
                f"- (0/{len(these)})"
            rows.append((env, estimator, len(these), f"{warm:.3f} +- {warm_se:.3f}", f"{final:.3f} +- {final_se:.3f}",
                         f"{min(r['min_after_start'] for r in these):.3f}",
                         to_reach if env == "frozenlake" else "", f"{sum(r['seconds'] for r in these) / len(these):.0f}"))
            result[f"{env}_{estimator}"] = final
    print(table(rows, ("env", "estimator", "runs", "warm-start eval", "final eval (mean +- SE)",
                       "lowest eval after start", f"steps to {REACH}", "wall s")))
    print(f"runs in {out}")
    print(result_line(**result, runs=args.runs))


if __name__ == "__main__":
    main()
