"""Loading a Config: defaults <- YAML file <- `section.key=value` overrides, validated.

The sections themselves (one dataclass per component) are in roll_agent/config.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from roll_agent.config import Config, ConfigError


def _check_keys(data: Any, cls: type, where: str) -> None:
    """Reject unknown keys anywhere in `data`, naming the closest valid key."""
    if not isinstance(data, dict):
        return
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), sorted(fields), n=1)
            hint = f" Did you mean '{(where + '.') if where else ''}{close[0]}'?" if close else ""
            raise ConfigError(f"Unknown config key '{path}'.{hint} Valid keys here: {sorted(fields)}")
        sub = hints[key]
        if dataclasses.is_dataclass(sub):
            _check_keys(value, sub, path)
        elif typing.get_origin(sub) is list and dataclasses.is_dataclass(typing.get_args(sub)[0]):
            for i, item in enumerate(value or []):
                _check_keys(item, typing.get_args(sub)[0], f"{path}[{i}]")


def _to_dict(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file <- `section.key=value` overrides; returns a validated Config.
    Any problem with them is a ConfigError (never a parser's own exception)."""
    try:
        return _load(path, overrides)
    except ConfigError:
        raise
    except (OmegaConfBaseException, yaml.YAMLError, TypeError, ValueError, KeyError, AttributeError, IndexError,
            RecursionError) as exc:  # malformed YAML or overrides that the OmegaConf/YAML parsers reject
        source = f"config file {path}" + (f" and overrides {overrides}" if overrides else "") if path else \
            f"overrides {overrides}"
        raise ConfigError(f"Cannot use {source}: {type(exc).__name__}: {exc}. Fix the value or key named here; "
                          "overrides look like section.key=value with YAML values.") from exc


def _load(path: str | None, overrides: list[str] | None) -> Config:
    layers = []
    if path:
        try:
            layers.append(OmegaConf.load(path))
        except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"Cannot read config file {path}: {exc}") from exc
    entries = []  # overrides of one list entry: envs.0.kwargs.split=valid_unseen
    if overrides:
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"Override '{item}' must look like section.key=value")
        entries = [item for item in overrides if _list_index(item.partition("=")[0]) is not None]
        plain = [item for item in overrides if item not in entries]
        if plain:
            layers.append(OmegaConf.from_dotlist(plain))
    for layer in layers:
        _check_keys(_to_dict(layer), Config, "")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), *layers)
        for item in entries:
            _set_entry(merged, item)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        raise ConfigError(f"Invalid value for '{key}': {exc.msg if hasattr(exc, 'msg') else exc}") from exc


def _list_index(key: str) -> int | None:
    """Where `key` (a dotted override key) names a list entry by its index (envs.0.tag: 1), else None."""
    return next((i for i, part in enumerate(key.split(".")) if part.isdigit()), None)


def _set_entry(merged, item: str) -> None:
    """Apply `list.N.key=value` to entry N of a list the file or defaults already hold."""
    key, _, text = item.partition("=")
    parts = key.split(".")
    at = _list_index(key)
    name = ".".join(parts[:at])
    owner: type = Config
    for part in parts[:at]:  # the type the list's entries have
        hint = typing.get_type_hints(owner).get(part) if dataclasses.is_dataclass(owner) else None
        if hint is None:
            raise ConfigError(f"Override '{item}': '{name}' is not a list of the config")
        owner = hint
    if typing.get_origin(owner) is not list:
        raise ConfigError(f"Override '{item}': '{name}' is not a list, so '{parts[at]}' cannot index it")
    entries = OmegaConf.select(merged, name)
    index = int(parts[at])
    if index >= len(entries):
        held = f"{len(entries)} entries ({name}.0 to {name}.{len(entries) - 1})" if len(entries) > 1 else \
            f"{len(entries)} entry ({name}.0)" if entries else "no entries"
        raise ConfigError(f"Override '{item}': {name} has {held}; to add one, give the whole list: {name}=[...]")
    value = OmegaConf.from_dotlist([f"value={text}"])["value"]  # parsed as any override's value
    element = typing.get_args(owner)[0]
    if dataclasses.is_dataclass(element):
        nested = _to_dict(value)
        for part in reversed(parts[at + 1:]):
            nested = {part: nested}
        _check_keys(nested, element, f"{name}[{index}]")
    whole = at + 1 == len(parts)  # list.N=... replaces the whole entry (its fields' defaults for the rest)
    if whole and dataclasses.is_dataclass(element):
        value = OmegaConf.merge(OmegaConf.structured(element), value)
    OmegaConf.update(merged, key, value, merge=not whole)


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Config) -> dict:
    """The config as plain dicts and lists (what the trackers record as the run's parameters)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg))
