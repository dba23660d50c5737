"""The trajectory viewer (python -m roll_agent.view) on a real 2-step run, looked at in a real
browser: headless Chromium opens the served page, the test reads what it shows and clicks
through it like a person; a screenshot is kept in outputs/test-artifacts/."""

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from roll_agent.trajectory_dumps import read_dumps
from roll_agent.view import load_run, serve
from tests.browser import Browser, find_chromium

ARTIFACTS = Path(__file__).resolve().parents[1] / "outputs" / "test-artifacts"


def test_the_static_page_embeds_the_run(dumped_run, tmp_path):
    out, _ = dumped_run
    page = tmp_path / "run.html"
    done = subprocess.run([sys.executable, "-m", "roll_agent.view", str(out), "--static", str(page)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    embedded = re.search(r'<script id="embedded" type="application/json">(.*?)</script>', page.read_text(), re.S)
    data = json.loads(embedded.group(1))
    episodes = read_dumps(out)
    assert len(data["run"]["episodes"]) == len(data["episodes"]) == len(episodes) > 0
    assert data["episodes"][0]["token_ids"] == episodes[0]["token_ids"]
    assert [r["step"] for r in data["run"]["metrics"] if "loss" in r] == [1, 2]


def test_the_server_answers_what_it_has_and_names_what_it_has_not(dumped_run):
    out, _ = dumped_run
    server = serve(out)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        run = json.load(urllib.request.urlopen(f"{base}/api/run", timeout=30))
        assert run["name"] == out.name and len(run["episodes"]) == len(read_dumps(out))
        first = json.load(urllib.request.urlopen(f"{base}/api/episode/0", timeout=30))
        assert first["token_ids"] == read_dumps(out)[0]["token_ids"]
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{base}/api/episode/100000", timeout=30)
        assert missing.value.code == 404 and "no episode 100000" in missing.value.read().decode()
    finally:
        server.shutdown()
    assert subprocess.run([sys.executable, "-m", "roll_agent.view", str(out / "nope"), "--static", "x.html"],
                          capture_output=True, text=True, timeout=120).returncode == 2


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium: apt-get install chromium (scripts/test.sh does)")
def test_a_person_reads_a_run_in_the_browser(dumped_run, tmp_path):
    out, _ = dumped_run
    episodes = read_dumps(out)
    index = load_run(out)[0]["episodes"]
    # an episode of step 2 with a token sampled a version before the one it was trained at
    chosen = next(i for i, e in enumerate(episodes) if e["kind"] == "train" and any(
        m and e["train_version"] - v > 0 for m, v in zip(e["loss_mask"], e["versions"])))
    ep = episodes[chosen]
    stale_k = next(k for k, (m, v) in enumerate(zip(ep["loss_mask"], ep["versions"])) if m and ep["train_version"] - v > 0)
    server = serve(out)
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(f"http://127.0.0.1:{server.server_address[1]}/")
        browser.wait_for("document.body && document.body.dataset.ready === '1'")
        # the episode table has the run's episodes, and the curves its metrics
        assert browser.evaluate("document.querySelectorAll('tr.episode').length") == len(episodes)
        assert "reward_mean" in browser.evaluate("[...document.querySelectorAll('.curve')].map(c => c.dataset.key)")
        # filtering by step keeps that step's episodes
        browser.evaluate("(() => { const s = document.getElementById('f-step'); s.value = '2';"
                         " s.dispatchEvent(new Event('input')); })()")
        assert browser.evaluate("document.querySelectorAll('tr.episode').length") == \
            sum(e["step"] == 2 for e in index)
        # clicking an episode shows its turns
        browser.click(f'tr.episode[data-index="{chosen}"]')
        browser.wait_for(f"document.getElementById('pane-0').dataset.episode === '{chosen}'")
        turns = browser.evaluate("[...document.querySelectorAll('#pane-0 .turn')].map(t => t.className)")
        assert turns == [f"turn {t['role']}" for t in ep["turns"]]
        shown = browser.evaluate("[...document.querySelectorAll('#pane-0 .turn.model')].map(t => t.textContent)")
        assert [s.split("\n", 1)[0] for s in shown][0].startswith("model")
        assert all(t["text"] in s for t, s in zip([t for t in ep["turns"] if t["role"] == "model"], shown))
        # the token view marks exactly the loss-masked tokens
        trained = browser.evaluate("[...document.querySelectorAll('#pane-0 .tok[data-mask=\"1\"]')]"
                                   ".map(s => Number(s.dataset.k))")
        assert trained == [k for k, m in enumerate(ep["loss_mask"]) if m]
        assert browser.evaluate("document.querySelectorAll('#pane-0 .tok').length") == len(ep["token_ids"])
        # coloured by staleness, a stale token shows its version age
        browser.click('#pane-0 button[data-mode="staleness"]')
        browser.wait_for("document.querySelector('#pane-0 .tokens').dataset.mode === 'staleness'")
        age = ep["train_version"] - ep["versions"][stale_k]
        token = browser.evaluate(f"(() => {{ const s = document.querySelector('#pane-0 .tok[data-k=\"{stale_k}\"]');"
                                 " return [s.dataset.age, s.title, getComputedStyle(s).backgroundColor]; })()")
        assert token[0] == str(age) and f"(age {age})" in token[1]
        assert token[2] == "rgb(255, 245, 157)"  # age 1: yellow
        fresh = [k for k, (m, v) in enumerate(zip(ep["loss_mask"], ep["versions"])) if m and v == ep["train_version"]]
        if fresh:
            assert browser.evaluate(f"document.querySelector('#pane-0 .tok[data-k=\"{fresh[0]}\"]').dataset.age") == "0"
        shot = browser.screenshot(ARTIFACTS / "viewer.png")
        assert shot.stat().st_size > 10_000
    finally:
        browser.close()
        server.shutdown()


def test_a_nan_in_a_run_does_not_break_the_page():
    from roll_agent.view import to_json

    assert json.loads(to_json({"a": [1.0, float("nan")], "b": {"c": float("inf")}})) == {"a": [1.0, None], "b": {"c": None}}
