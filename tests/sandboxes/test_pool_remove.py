"""pool.remove against a daemon that refuses or is slow to remove (no daemon needed: the
docker API client is replaced by one that answers as a busy daemon does)."""
from __future__ import annotations

import logging

import docker
import pytest
import requests

from sandboxes import pool


class BusyDaemon:
    """remove_container answers each call with the next of `answers` (an exception to raise, or None)."""

    def __init__(self, *answers):
        self.answers, self.calls = list(answers), 0

    def remove_container(self, cid, force=False, v=False):
        assert force and v  # killed and its volumes deleted: nothing left behind
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else self.final
        if answer is not None:
            raise answer

    final = docker.errors.APIError("removal of container abc is already in progress")


def test_a_removal_in_progress_is_asked_again_until_the_daemon_says_gone():
    api = BusyDaemon(docker.errors.APIError("removal of container abc is already in progress"),
                     requests.exceptions.ReadTimeout("read timed out"), docker.errors.NotFound("no such container"))
    pool.remove(api, "abc")
    assert api.calls == 3


def test_a_removal_that_succeeds_is_asked_once():
    api = BusyDaemon(None)
    pool.remove(api, "abc")
    assert api.calls == 1


def test_a_removal_refused_for_good_is_tried_a_few_times_past_the_deadline_then_logged(monkeypatch, caplog):
    monkeypatch.setattr(pool, "REMOVE_TIMEOUT_S", 0.0)  # the deadline has passed at the first answer
    api = BusyDaemon()
    with caplog.at_level(logging.WARNING, logger=pool.log.name):
        pool.remove(api, "abcdef0123456789")
    assert api.calls == pool.REMOVE_ATTEMPTS  # a timed-out call may have removed nothing: asked again anyway
    assert "could not remove sandbox container abcdef012345" in caplog.text


def test_an_error_that_is_no_daemon_answer_is_not_swallowed():
    with pytest.raises(ValueError, match="a bug of ours"):
        pool.remove(BusyDaemon(ValueError("a bug of ours")), "abc")
