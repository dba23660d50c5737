"""Experiment trackers (roll_agent/trackers.py): a 2-step run logs to W&B offline and to a local
MLflow store, with no server and no network, the same scalars as metrics.jsonl and the rollout
sample as a table."""

import json
from pathlib import Path

import pytest

from roll_agent.config import ConfigError
from roll_agent.config_loader import load_config
from roll_agent.metrics import read_rows
from roll_agent.run import train
from tests.conftest import run
from tests.test_run import small_cfg

KEYS = ("reward_mean", "success_rate", "loss", "grad_norm", "staleness_mean")


def wandb_records(path: Path):
    """The records of an offline W&B run file (`run-<id>.wandb`: a LevelDB-style log of
    protobuf records in 32 KiB blocks after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunk = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            yield record
            chunk = b""


@pytest.mark.slow
def test_a_run_logs_to_wandb_offline_and_to_a_local_mlflow_store(tmp_path):
    cfg = small_cfg(tmp_path, "logging.backends=[jsonl, tensorboard, wandb, mlflow]", "logging.project=trackers-test")
    assert run(train(cfg), timeout=300) == 2
    rows = [r for r in read_rows(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]

    # W&B: an offline run in output_dir/wandb, its history the rows of metrics.jsonl
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    history, config = {}, {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            history.setdefault(items["_step"], {}).update(items)
        elif kind == "run":  # the run's config comes with its start
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    for row in rows:
        for key in KEYS:
            assert history[row["step"]][key] == pytest.approx(row[key], rel=1e-6), key
    assert history[2]["rollouts/_type"] == "table-file" and history[2]["rollouts/nrows"] == 2  # step 2's group of 2
    assert config["rollout"]["group_size"] == 2 and config["max_steps"] == 2
    assert list((tmp_path / "wandb").glob("offline-run-*/files/media/table/rollouts_*.table.json"))

    # MLflow: a local SQLite store in output_dir, artifacts beside it
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (mlrun,) = client.search_runs([client.get_experiment_by_name("trackers-test").experiment_id])
    assert mlrun.data.params["rollout.group_size"] == "2" and mlrun.info.status == "FINISHED"
    for key in KEYS:
        logged = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, key)}
        assert logged == pytest.approx({r["step"]: r[key] for r in rows}, rel=1e-6), key
    table = json.loads(next((tmp_path / "mlartifacts").rglob("rollouts/step_2.json")).read_text())
    assert table["step"] == 2 and table["rows"] and {"seed", "reward", "status"} <= set(table["rows"][0])
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_backends_are_checked_when_the_config_is_read():
    with pytest.raises(ConfigError, match="must include jsonl"):
        load_config(overrides=["logging.backends=[tensorboard]"])
    with pytest.raises(ConfigError, match="Did you mean 'mlflow'"):
        load_config(overrides=["logging.backends=[jsonl, mlfow]"])
    with pytest.raises(ConfigError, match="wandb_mode"):
        load_config(overrides=["logging.wandb_mode=cloud"])


def test_a_tracker_that_is_not_installed_is_a_config_error_naming_the_install(monkeypatch):
    import importlib.util

    from roll_agent.run import check_startup

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="pip install wandb"):
        check_startup(load_config(overrides=["logging.backends=[jsonl, wandb]"]))
