"""Trained samples/s of the local runtime against the Ray runtime, same config, side by side.

Setting: the default run (tiny Qwen2 on the `hf` engine, GRPO on FrozenLake, async ratio
2, 8 env groups of 8 + 1 redundant env, 8 groups per step), with warm-up, evaluation,
checkpoints and logging off and runtime.torch_threads=1 for both runtimes (the local
runtime's trainer and engine threads get one core each; under Ray each actor process
gets one). Ray runs on a local cluster of `--cpus` CPUs started by the run (its ~10-20 s
start-up and actor creation are outside the measured steps, as the local runtime's
model loading is). The base model is built once and passed to every run as model.path.

samples/s = episodes trained in steps `skip+1..N` / sum of those steps' `time_step_s`
(batch wait + train + weight sync: the training loop's wall time). Rounds alternate the
order (local first, then Ray first) against drift on a noisy machine; rates pool all rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import result_line, table  # noqa: E402
from roll_agent.config import Config  # noqa: E402
from roll_agent.config_loader import load_config  # noqa: E402
from roll_agent.run import train  # noqa: E402
from roll_agent.tiny_model import prepare_model  # noqa: E402

RUNTIMES = ("local", "ray")


def make_config(runtime: str, out: Path, args, model_path: str = "") -> Config:
    cfg = load_config(None, [
        f"output_dir={out}", f"max_steps={args.steps}", f"runtime.type={runtime}", "runtime.torch_threads=1",
        f"runtime.ray.num_cpus={args.cpus}", "warmup.sft_steps=0", "eval.num_episodes=0", "checkpoint.every=0",
        "logging.progress=false", "logging.backends=[jsonl]", "logging.plot=false",
    ])
    cfg.model.path = model_path
    return cfg


def run_one(runtime: str, root: Path, model_path: str, args, tag: str) -> dict:
    out = root / f"{runtime}-{tag}"
    asyncio.run(train(make_config(runtime, out, args, model_path)))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time_step_s" in r][args.skip:]
    return {"episodes": sum(r["episodes"] for r in rows), "seconds": sum(r["time_step_s"] for r in rows),
            "train": sum(r["time_train_s"] for r in rows) / len(rows),
            "sync": sum(r["time_sync_s"] for r in rows) / len(rows),
            "wait": sum(r["time_wait_data_s"] for r in rows) / len(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="training steps per run")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the rates")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    args = ap.parse_args()
    start, load0 = time.perf_counter(), os.getloadavg()[0]
    results: dict[str, list[dict]] = {r: [] for r in RUNTIMES}
    with tempfile.TemporaryDirectory(prefix="rt_overhead_", dir="/tmp") as tmp:
        root = Path(tmp)
        model_path = prepare_model(make_config("local", root, args), root)
        for rnd in range(args.rounds):
            for runtime in RUNTIMES if rnd % 2 == 0 else RUNTIMES[::-1]:
                t0 = time.perf_counter()
                results[runtime].append(run_one(runtime, root, model_path, args, f"r{rnd}"))
                last = results[runtime][-1]
                print(f"round {rnd} {runtime}: {last['episodes'] / last['seconds']:.2f} samples/s "
                      f"(run {time.perf_counter() - t0:.0f} s)", flush=True)

    rate = {r: sum(x["episodes"] for x in results[r]) / sum(x["seconds"] for x in results[r]) for r in RUNTIMES}

    def mean(runtime: str, key: str) -> float:
        return sum(x[key] for x in results[runtime]) / len(results[runtime])

    rows = [(r, rate[r], rate[r] / rate["local"], mean(r, "train"), mean(r, "sync"), mean(r, "wait"),
             " ".join(f"{x['episodes'] / x['seconds']:.2f}" for x in results[r])) for r in RUNTIMES]
    print(f"\n{args.rounds} round(s) x {args.steps} steps (first {args.skip} skipped); ray on {args.cpus} CPUs; "
          f"{time.perf_counter() - start:.0f} s; load average {load0:.1f} -> {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    print(table(rows, ("runtime", "samples/s", "x local", "train_s", "sync_s", "wait_s", "per round")))
    print(result_line(ratio=rate["ray"] / rate["local"], sps_local=rate["local"], sps_ray=rate["ray"],
                      rounds=args.rounds, target_met=rate["ray"] / rate["local"] >= 0.7))


if __name__ == "__main__":
    main()
