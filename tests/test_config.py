"""Config loading: defaults, YAML files, overrides, and errors that name the fix."""

from pathlib import Path

import pytest

from roll_agent.config import Config, ConfigError
from roll_agent.config_loader import load_config

CONFIGS = sorted((Path(__file__).parent.parent / "configs").rglob("*.yaml"))


def test_defaults_are_the_embedded_run():
    cfg = load_config()
    assert cfg == Config()
    assert cfg.rollout.async_ratio == 2 and cfg.engine.type == "hf" and cfg.model.path == ""


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_file_is_valid(path):
    load_config(str(path))


def test_default_yaml_spells_out_the_defaults():
    assert load_config(str(Path(__file__).parent.parent / "configs" / "default.yaml")) == Config()


def test_overrides_reach_the_sections():
    cfg = load_config(None, ["rollout.async_ratio=4", "trainer.lr=0.5", "envs=[{id: roll_agent/Sokoban-v0}]"])
    assert cfg.rollout.async_ratio == 4 and cfg.trainer.lr == 0.5
    assert cfg.envs[0].id == "roll_agent/Sokoban-v0"


def test_unknown_key_names_the_closest_valid_one():
    with pytest.raises(ConfigError, match=r"rollout\.async_ration.*Did you mean 'rollout\.async_ratio'"):
        load_config(None, ["rollout.async_ration=2"])
    with pytest.raises(ConfigError, match=r"Unknown config key 'trainr'.*Did you mean 'trainer'"):
        load_config(None, ["trainr.lr=1"])


def test_unknown_key_in_a_list_of_envs(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("envs:\n  - id: roll_agent/FrozenLake-v0\n    kwarg: {}\n")
    with pytest.raises(ConfigError, match=r"envs\[0\]\.kwarg.*Did you mean 'envs\[0\]\.kwargs'"):
        load_config(str(path))


def test_an_override_may_name_one_entry_of_a_list():
    """`envs.0.kwargs.split=...` sets one key of one entry (the rest stays as the file has it);
    `envs.0={...}` replaces the entry; a missing entry or a misspelt key is a config error."""
    cfg = load_config("configs/alfworld.yaml", ["envs.0.kwargs.split=valid_unseen", "envs.0.tag=seen", "max_steps=3"])
    assert cfg.envs[0].kwargs["split"] == "valid_unseen" and cfg.envs[0].tag == "seen" and cfg.max_steps == 3
    assert cfg.envs[0].id == load_config("configs/alfworld.yaml").envs[0].id  # the rest as the file has it
    cfg = load_config(None, ["envs.0={id: roll_agent/Sokoban-v0, kwargs: {dim: 5}}", "logging.backends.1=wandb"])
    assert (cfg.envs[0].id, cfg.envs[0].kwargs, cfg.envs[0].tag) == ("roll_agent/Sokoban-v0", {"dim": 5}, "")
    assert cfg.logging.backends == ["jsonl", "wandb"]
    with pytest.raises(ConfigError, match=r"envs has 1 entry \(envs.0\); to add one, give the whole list: envs=\[...\]"):
        load_config(None, ["envs.1.tag=x"])
    with pytest.raises(ConfigError, match=r"Unknown config key 'envs\[0\]\.kwarg'.*Did you mean 'envs\[0\]\.kwargs'"):
        load_config(None, ["envs.0.kwarg.size=5"])
    with pytest.raises(ConfigError, match="'max_steps' is not a list, so '0' cannot index it"):
        load_config(None, ["max_steps.0=1"])


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match="rollout.async_ratio"):
        load_config(None, ["rollout.async_ratio=fast"])


def test_bad_choice_suggests_the_valid_one():
    with pytest.raises(ConfigError, match="Did you mean 'grpo'"):
        load_config(None, ["algorithm.advantage=grp"])


def test_malformed_yaml_is_a_config_error(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("rollout: [unclosed\n")
    with pytest.raises(ConfigError, match="Cannot read config file"):
        load_config(str(path))
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["no_equals_sign"])
