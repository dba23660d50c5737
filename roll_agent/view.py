"""See what the agent did: a run's curves, its dumped episodes and their tokens in the browser.

    python -m roll_agent.view RUN_DIR                 # serves the page on 127.0.0.1, prints its URL
    python -m roll_agent.view RUN_DIR --static OUT.html   # one self-contained file instead

RUN_DIR is a run's `output_dir`: the page reads its `metrics.jsonl` and the episodes that
`logging.trajectories` dumped (roll_agent/trajectory_dumps.py). It shows the curves, a table
of episodes (filter by step, kind, env tag, status, reward; sort by any column), one episode
as a transcript (model answers, observations, per-turn rewards; a SWE episode's final diff
and grade; an agent episode's segments), a token view coloured by loss mask, by version age
(staleness) or by |trainer - sampler| log-prob, and a second episode of the same task seed
beside it. Served, the page reads the run afresh on each load (a run still going shows its
latest steps); the static file embeds everything.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from roll_agent.metrics import read_rows
from roll_agent.trajectory_dumps import read_dumps

PAGE = Path(__file__).with_name("view_page.html")
INDEX_KEYS = ("step", "kind", "env_tag", "seed", "group_id", "status", "reward", "success", "num_turns")


_CACHE: dict = {}  # run dir -> (what its files were: names, sizes, mtimes; the loaded run)


def load_run_cached(run_dir: Path) -> tuple[dict, list[dict]]:
    """`load_run`, read again only when the run's files changed (the server answers many requests)."""
    run_dir = Path(run_dir)
    files = [run_dir / "metrics.jsonl", *sorted((run_dir / "trajectories").glob("*.jsonl.gz"))]
    stamp = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists()]
    if _CACHE.get(run_dir, (None,))[0] != stamp:
        _CACHE[run_dir] = (stamp, load_run(run_dir))
    return _CACHE[run_dir][1]


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """(the run: name, metric rows, an index row per episode), and the episodes themselves."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a run's output_dir (no such folder)")
    metrics = read_rows(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    episodes = read_dumps(run_dir)
    index = [{"i": i, **{k: e.get(k) for k in INDEX_KEYS}, "tokens": len(e.get("token_ids", [])),
              "segments": len(e.get("segments", []))} for i, e in enumerate(episodes)]
    return {"name": run_dir.resolve().name, "metrics": metrics, "episodes": index}, episodes


def to_json(value) -> str:
    """JSON a browser parses: a NaN or infinity (an env's info, a diverged metric) becomes null."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False)


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def page(embedded: dict | None = None) -> str:
    """The viewer page; with `embedded` ({"run": ..., "episodes": [...]}) it needs no server."""
    data = "null" if embedded is None else to_json(embedded).replace("</", "<\\/")
    return PAGE.read_text().replace("__EMBEDDED__", data)


def write_static(run_dir: Path, out: Path) -> Path:
    run, episodes = load_run(run_dir)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page({"run": run, "episodes": episodes}))
    return out


class _Handler(BaseHTTPRequestHandler):
    def __init__(self, *args, run_dir: Path, **kwargs):
        self.run_dir = run_dir
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        path = self.path.split("?")[0]
        try:
            if path in ("/", "/index.html"):
                return self._send(200, "text/html; charset=utf-8", page().encode())
            if path == "/api/run":
                return self._json(load_run_cached(self.run_dir)[0])
            if path.startswith("/api/episode/"):
                episodes = load_run_cached(self.run_dir)[1]
                i = int(path.rsplit("/", 1)[1])
                if not 0 <= i < len(episodes):
                    return self._json({"error": f"no episode {i} (the run has {len(episodes)})"}, 404)
                return self._json(episodes[i])
            return self._json({"error": f"no page {path}"}, 404)
        except (ValueError, OSError) as exc:
            return self._json({"error": str(exc)}, 400)

    def _json(self, value, status: int = 200) -> None:
        self._send(status, "application/json", to_json(value).encode())

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:  # noqa: A002  quiet: the URL is printed once
        pass


def serve(run_dir: Path, port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A server for the page, running in a background thread (`.shutdown()` stops it)."""
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"{run_dir} is not a run's output_dir (no such folder)")
    server = ThreadingHTTPServer((host, port), partial(_Handler, run_dir=Path(run_dir)))
    threading.Thread(target=server.serve_forever, name="viewer", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m roll_agent.view", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run's output_dir")
    parser.add_argument("--static", type=Path, metavar="OUT.html", help="write one self-contained file and exit")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    try:
        if args.static:
            print(f"wrote {write_static(args.run_dir, args.static)}")
            return 0
        server = serve(args.run_dir, args.port)
    except (FileNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"viewer for {args.run_dir}: http://127.0.0.1:{server.server_address[1]}/  (Ctrl-C stops it)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
