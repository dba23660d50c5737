"""TRL's side of the head-to-head: `GRPOTrainer` as its documentation sets it up, on CPU.

Run by `run.py` with TRL's own interpreter (`/work/venv-trl/bin/python`, see docs/performance.md, "roll_agent vs TRL"):

    python benchmarks/vs_trl/trl_side.py SPEC.json

SPEC (written by run.py) names the task, the checkpoint, the output dir and the shared
hyperparameters. Writes `result.json` there: the wall-clock of `trainer.train()` (first
step to last, as roll_agent's is measured), reward per step against that clock, the
prompt token ids it rendered for one seed (run.py checks they equal roll_agent's), and
saves the trained model for the common greedy evaluation.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from benchmarks.vs_trl import tasks  # noqa: E402


class Clock(TrainerCallback):
    """Reward of each optimizer step against the wall-clock since `train()` began."""

    def __init__(self):
        self.t0 = self.t1 = 0.0
        self.curve: list[tuple[float, float]] = []
        self.tool_calls: list[float] = []  # per sample, each step
        self.lengths: list[float] = []  # generated tokens per sample, each step
        self.marks: list[tuple[float, float]] = []  # (wall, this process's CPU seconds) at each step's end

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0 = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.curve.append((time.perf_counter() - self.t0, float(logs["reward"])))
            self.marks.append((time.perf_counter(), time.process_time()))  # every thread's, user + system
            self.tool_calls.append(float(logs.get("tools/call_frequency", 0.0)))
            self.lengths.append(float(logs.get("completions/mean_length", float("nan"))))

    def on_train_end(self, args, state, control, **kwargs):
        self.t1 = time.perf_counter()


def grpo_config(spec: dict, out: Path) -> GRPOConfig:
    hp = spec["hp"]
    return GRPOConfig(
        output_dir=str(out / "trainer"),
        use_cpu=True, bf16=False, fp16=False,  # the CPU machine; fp32 like roll_agent
        gradient_checkpointing=False,  # a tiny model fits: recomputing activations would only cost time
        max_steps=spec["steps"], seed=hp["seed"],
        num_generations=hp["group_size"],
        per_device_train_batch_size=hp["micro_batch_size"],
        gradient_accumulation_steps=hp["group_size"] * hp["groups_per_batch"] // hp["micro_batch_size"],
        learning_rate=hp["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
        max_completion_length=spec["max_tokens"], temperature=hp["temperature"], top_p=1.0, top_k=0,
        beta=0.0, epsilon=hp["clip"], loss_type="dapo", scale_rewards="group",
        max_tool_calling_iterations=spec["max_turns"] - 1 if spec["task"] == tasks.MULTI_TURN else None,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0,
    )


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    if spec.get("torch_threads"):
        import torch

        torch.set_num_threads(spec["torch_threads"])
    out = Path(spec["out"])
    task = spec["task"]
    tasks.TOOL_LATENCY.update(spec["tool_latency"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"], padding_side="left")
    n_prompts = spec["steps"] * spec["hp"]["groups_per_batch"]
    dataset = Dataset.from_list([tasks.prompt_row(task, s) for s in tasks.train_seeds(n_prompts, spec["hp"]["seed"])])
    if task == tasks.SINGLE_TURN:
        kwargs = {"reward_funcs": tasks.reverse_reward}
    else:
        kwargs = {"reward_funcs": tasks.calculator_reward, "environment_factory": tasks.CalculatorToolEnv}
    clock = Clock()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=spec["model"], args=grpo_config(spec, out), train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[clock], **kwargs)
        trainer.train()
    trainer.save_model(str(out / "model"))
    tokenizer.save_pretrained(str(out / "model"))
    result = {"seconds": clock.t1 - clock.t0, "samples": spec["steps"] * spec["hp"]["group_size"]
              * spec["hp"]["groups_per_batch"], "curve": clock.curve, "model": str(out / "model"),
              "tool_calls": sum(clock.tool_calls) / max(len(clock.tool_calls), 1),
              "tokens_per_sample": sum(clock.lengths) / max(len(clock.lengths), 1),
              "prompt_ids": probe_prompt(trainer, task, spec["probe_seed"]), "torch_threads": torch_threads(),
              # CPU from the first step's end to the last's, over the samples of the steps between
              "cpu": {"seconds": clock.marks[-1][1] - clock.marks[0][1], "wall_s": clock.marks[-1][0] - clock.marks[0][0],
                      "samples": (len(clock.marks) - 1) * spec["hp"]["group_size"] * spec["hp"]["groups_per_batch"]}}
    (out / "result.json").write_text(json.dumps(result))


def probe_prompt(trainer: GRPOTrainer, task: str, seed: int) -> list[int]:
    """The token ids TRL generates from for `seed` (its own tokenize path, environment reset included)."""
    row = tasks.prompt_row(task, seed)
    prompt = row["prompt"]
    if task == tasks.MULTI_TURN:
        env = tasks.CalculatorToolEnv()
        prompt = prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + env.reset(seed)}]
        trainer._batch_environments = [None]
    ids, _, _ = trainer._tokenize_prompts([prompt])
    return list(ids[0])


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
