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
