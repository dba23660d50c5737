"""Step time of the default run with rollout dumps on (its default) against off, side by side.

Setting: the default run (tiny Qwen2 on the `hf` engine, GRPO on FrozenLake, async ratio 2,
8 env groups of 8 + 1, 8 groups per step), warm-up, evaluation, checkpoints, plots and
TensorBoard off in both arms; `on` dumps one group of every step's batch with the trainer's
log-probs (`logging.trajectories` defaults: every 1, groups 1), `off` sets every=0. The base
model is built once and shared. Step time = the mean `time_step_s` of steps `skip+1..N`
(batch wait + train + weight sync). Rounds alternate the order against drift; the means
pool all rounds. Target: on / off <= 1.05.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/trajectory_dumps.py [--rounds 2 --steps 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import result_line  # noqa: E402
from roll_agent.config import Config  # noqa: E402
from roll_agent.config_loader import load_config  # noqa: E402
from roll_agent.run import train  # noqa: E402
from roll_agent.tiny_model import prepare_model  # noqa: E402

ARMS = {"off": ["logging.trajectories.every=0"], "on": []}


def make_config(arm: str, out: Path, args, model_path: str = "") -> Config:
    cfg = load_config(None, [
        f"output_dir={out}", f"max_steps={args.steps}", "warmup.sft_steps=0", "eval.num_episodes=0",
        "checkpoint.every=0", "logging.progress=false", "logging.backends=[jsonl]", "logging.plot=false",
        *ARMS[arm]])
    cfg.model.path = model_path
    return cfg


def run_one(arm: str, root: Path, model_path: str, args, tag: str) -> list[float]:
    out = root / f"{arm}-{tag}"
    asyncio.run(train(make_config(arm, out, args, model_path)))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    dumped = sorted(p.name for p in (out / "trajectories").glob("*.jsonl.gz")) if (out / "trajectories").is_dir() else []
    assert bool(dumped) == (arm == "on"), dumped
    return [r["time_step_s"] for r in rows if "time_step_s" in r][args.skip:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="training steps per run")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    args = ap.parse_args()
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="dumps_bench_", dir="/tmp") as tmp:
        root = Path(tmp)
        model_path = prepare_model(make_config("off", root, args), root)
        for rnd in range(args.rounds):
            for arm in list(ARMS) if rnd % 2 == 0 else list(ARMS)[::-1]:
                steps = run_one(arm, root, model_path, args, f"r{rnd}")
                times[arm] += steps
                print(f"round {rnd} {arm}: mean step {sum(steps) / len(steps):.3f} s over {len(steps)} steps", flush=True)
    mean = {arm: sum(t) / len(t) for arm, t in times.items()}
    ratio = mean["on"] / mean["off"]
    verdict = "met" if ratio <= 1.05 else "missed"
    print(f"step time with dumps on / off: {ratio:.3f} (target <= 1.05: {verdict})")
    print(result_line(dumps_step_time_ratio=ratio, step_s_on=mean["on"], step_s_off=mean["off"],
                      steps=len(times["on"]), target_met=ratio <= 1.05))


if __name__ == "__main__":
    main()
