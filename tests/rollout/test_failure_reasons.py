"""Why episodes failed, counted by class in the episode ledger (roll_agent/rollout/accounting.py)."""

from roll_agent.rollout.accounting import MAX_REASON_CLASSES, EpisodeLedger, reason_class
from roll_agent.types import Status


def test_a_reason_is_classed_by_the_exception_it_names_a_timeout_or_an_exit_code():
    assert reason_class("SimulatedEnvError: simulated failure at step 2\n  File env.py, line 3") == "SimulatedEnvError"
    assert reason_class("the agent pkg.mod:run raised KeyError: 'x'\nTraceback ...") == "KeyError"
    assert reason_class("env stuck for 0.2s waiting on env g0-e1 stage step") == "timeout"
    assert reason_class("the agent pkg.mod:run did not finish within timeout_s=60s") == "timeout"
    assert reason_class("the agent command ./agent.sh exited with code 3; stderr tail:\nboom") == "exit_3"
    assert reason_class("the agent made no model call through the endpoint") == "other"


def test_the_ledger_counts_reasons_keeps_the_first_of_each_and_bounds_the_classes():
    ledger = EpisodeLedger()
    ledger.end(Status.ENV_ERROR, reason="ValueError: first")
    ledger.end(Status.ENV_ERROR, 2, reason="ValueError: second")
    ledger.end(Status.CANCELLED)  # a redundant episode: no reason, not a failure
    ledger.end(Status.ENV_ERROR, reason="x" * 10_000 + "TailError")
    assert ledger.counts == {"env_error": 4, "cancelled": 1}
    assert ledger.reasons == {"env_error/ValueError": 3, "env_error/other": 1}
    assert ledger.examples["env_error/ValueError"] == "ValueError: first"
    assert len(ledger.examples["env_error/other"]) < 5_000 and ledger.examples["env_error/other"].endswith("TailError")

    for i in range(MAX_REASON_CLASSES + 5):
        ledger.end(Status.ENV_ERROR, reason=f"Kind{i}Error: boom")
    assert len(ledger.reasons) == MAX_REASON_CLASSES  # later classes count as other
    assert sum(ledger.reasons.values()) == ledger.counts["env_error"]
