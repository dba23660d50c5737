"""Build the embedded default model from scratch: no download, no hub.

A byte-level BPE tokenizer is trained on text the envs themselves produce, given a
ChatML chat template, and saved beside a randomly initialised model built from an
architecture config. The result is an ordinary transformers checkpoint directory, so
the rest of the system loads it exactly like a user's `model.path`.
"""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from roll_agent.config import Config, EnvSpec, TinyModelConfig
from roll_agent.env_extras import agent_of, expert

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, plus tools in the Hermes / Qwen convention: the tool schemas are listed in the system
# turn, an assistant's tool calls are written as <tool_call>{json}</tool_call>, and a tool result
# comes back as a user turn wrapped in <tool_response>. Plain conversations render as bare ChatML.
CHATML_TEMPLATE = (
    "{% set ns = namespace(start=0) %}"
    "{% if tools %}{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% set ns.start = 1 %}{% endif %}"
    "{{ 'Tools:\n' }}{% for tool in tools %}{{ tool | tojson + '\n' }}{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages[ns.start:] %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] or [] %}{% set f = call['function'] %}"
    "{{ '<tool_call>\n' + {'name': f['name'], 'arguments': f['arguments']} | tojson + '\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# How transformers' `parse_response` reads an assistant turn of that template back into
# content and tool calls (what tool-calling trainers and servers use).
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {"open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True,
                       "content": "json", "transform": {"type": "function", "function": "{content}"}},
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
MARKER = "tiny_model.json"


def env_corpus(env_specs: list[EnvSpec], episodes_per_env: int = 24, seed: int = 0,
               progress: bool = False) -> list[str]:
    """Instructions, observations and actions of short random and expert episodes."""
    from tqdm import tqdm

    from roll_agent.env_registry import make_env

    rng = random.Random(seed)
    texts: list[str] = []
    bar = tqdm(total=len(env_specs) * episodes_per_env, desc="model: tokenizer corpus", unit="episode",
               disable=not progress, dynamic_ncols=True)
    for spec in env_specs:
        env, failures = make_env(spec), []
        try:
            for ep in range(episodes_per_env):
                bar.update(1)
                try:
                    texts += _corpus_episode(env, rng)
                except Exception as exc:  # a flaky env costs this episode only: a fresh env plays the next
                    failures.append(f"{type(exc).__name__}: {exc}")
                    env.close()
                    env = make_env(spec)
        finally:
            env.close()
        if failures:
            log.warning("model: %d of %d corpus episodes of %s failed and were left out; the first: %s",
                        len(failures), episodes_per_env, spec.id, failures[0])
    bar.close()
    return texts


def _corpus_episode(env, rng: random.Random) -> list[str]:
    obs, info = env.reset(seed=rng.randrange(10**6))
    texts = [info.get("instructions", ""), obs] + [json.dumps(t) for t in info.get("tools") or []]
    if agent_of(env) is not None:
        return texts  # an agent env's episode is its agent's run: the task text is what it has
    for _ in range(12):
        action = _corpus_action(env, info, rng)
        texts.append(action)
        obs, _, term, trunc, info = env.step(action)
        texts.append(obs)
        if term or trunc:
            break
    return texts


def _corpus_action(env, info: dict, rng: random.Random) -> str:
    admissible = info.get("admissible_actions")
    if admissible and rng.random() < 0.5:
        return rng.choice(admissible)
    act = expert(env)
    return act() if act else "noop"


def build_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.response_template = RESPONSE_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | os.PathLike, cfg: TinyModelConfig, corpus: Callable[[], list[str]],
                     seed: int = 0, key: object = None) -> Path:
    """Write tokenizer + randomly initialised model to `out_dir`.

    Reused when already built from the same `cfg`, `seed` and `key` (what the corpus is
    made from): the corpus, which plays env episodes, is only produced on a miss.
    """
    out = Path(out_dir)
    fingerprint = json.loads(json.dumps({"cfg": vars(cfg), "seed": seed, "key": key}, default=str))
    marker = out / MARKER
    if marker.exists() and json.loads(marker.read_text()) == fingerprint:
        return out
    out.mkdir(parents=True, exist_ok=True)
    corpus = corpus()
    tokenizer = build_tokenizer(corpus, cfg.vocab_size)
    model_type = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}.get(cfg.architecture)
    if model_type is None:
        raise ValueError(f"model.tiny.architecture={cfg.architecture!r}: use Qwen2ForCausalLM or LlamaForCausalLM")
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker.write_text(json.dumps(fingerprint))
    return out


def prepare_model(cfg: Config, out: Path) -> str:
    """A user's checkpoint, or the tiny model built from the envs' own text."""
    if cfg.model.path:
        return cfg.model.path
    corpus = lambda: env_corpus(cfg.envs, episodes_per_env=cfg.model.tiny.corpus_episodes, seed=cfg.seed,  # noqa: E731
                                progress=cfg.logging.progress)
    key = [(s.id, s.kwargs) for s in cfg.envs]
    return str(build_tiny_model(out / "base_model", cfg.model.tiny, corpus, seed=cfg.seed, key=key))
