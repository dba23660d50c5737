"""Sandbox latency: start + exec + close per backend, cold and warm.

    python benchmarks/sandbox_latency.py [--n 30] [--skip-docker]

What an env waits for before its first command returns is timed apart from the close
(which is off the critical path: a finished episode's sandbox can go in the background).
- docker_warm: acquire a pre-started container from the pool + first exec (target
  <= 50 ms median); the pool is refilled between samples, as it is between episodes.
- docker_cold: create + start a container + first exec.
- bwrap: start (work dirs, cgroup) + first exec (target <= 30 ms median).
- *_exec: one more exec in a running sandbox; *_close: kill + clean up.

Last line: RESULT docker_warm_ms=... bwrap_ms=... docker_cold_ms=... (medians, ms).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sandboxes import make_sandbox, pool  # noqa: E402


def ms(samples: list[float]) -> float:
    return 1000 * statistics.median(samples)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def lifecycle(backend: str, n: int, **cfg) -> tuple[list[float], list[float]]:
    """(start + first exec, close) times, n samples."""
    def once():
        t0 = time.perf_counter()
        sb = make_sandbox(backend, **cfg).start()
        assert sb.exec("true").exit_code == 0
        t1 = time.perf_counter()
        sb.close()
        return t1 - t0, time.perf_counter() - t1

    once()  # warm caches (image inspect, client, sweep) so the samples are steady-state
    samples = [once() for _ in range(n)]
    return [s[0] for s in samples], [s[1] for s in samples]


def exec_only(backend: str, n: int, **cfg) -> list[float]:
    with make_sandbox(backend, **cfg) as sb:
        sb.exec("true")
        return [timed(lambda: sb.exec("true")) for _ in range(n)]


def docker_warm(n: int) -> tuple[list[float], list[float]]:
    cfg = dict(pool_size=2)
    p = pool.warm_pool(make_sandbox("docker", **cfg).config)
    acquire, close = [], []
    try:
        for _ in range(n + 1):
            p.wait_full(120)
            t0 = time.perf_counter()
            sb = make_sandbox("docker", **cfg).start()
            assert sb.exec("true").exit_code == 0
            t1 = time.perf_counter()
            sb.close()
            acquire.append(t1 - t0)
            close.append(time.perf_counter() - t1)
    finally:
        pool.shutdown_pools()
    return acquire[1:], close[1:]


def table(rows: list[tuple]) -> str:
    lines = [f"{'measurement':<34}{'median ms':>10}{'p10':>9}{'p90':>9}"]
    for name, s in rows:
        q = statistics.quantiles([1000 * x for x in s], n=10) if len(s) > 1 else [1000 * s[0]] * 9
        lines.append(f"{name:<34}{ms(s):>10.1f}{q[0]:>9.1f}{q[-1]:>9.1f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=30, help="samples per measurement")
    ap.add_argument("--skip-docker", action="store_true")
    args = ap.parse_args()
    n = args.n
    rows, result = [], {}

    def add(key: str, name: str, samples: list[float]) -> None:
        rows.append((name, samples))
        result[key] = round(ms(samples), 1)

    if not args.skip_docker:
        warm, warm_close = docker_warm(n)
        add("docker_warm_ms", "docker warm: pool acquire + exec", warm)
        cold, cold_close = lifecycle("docker", max(5, n // 3))
        add("docker_cold_ms", "docker cold: start + exec", cold)
        add("docker_close_ms", "docker close (kill + remove)", warm_close + cold_close)
        add("docker_exec_ms", "docker exec (command server)", exec_only("docker", n))
        add("docker_cli_exec_ms", "docker exec (exec_mode=exec)", exec_only("docker", max(5, n // 3),
                                                                             exec_mode="exec"))
    start, close = lifecycle("bwrap", n)
    add("bwrap_ms", "bwrap: start + exec", start)
    add("bwrap_close_ms", "bwrap close", close)
    add("bwrap_exec_ms", "bwrap exec", exec_only("bwrap", n))
    from sandboxes.build_image import rootfs_path

    if rootfs_path().is_dir():
        add("bwrap_rootfs_ms", "bwrap (base rootfs): start + exec", lifecycle("bwrap", n, root="base")[0])
    add("local_ms", "local: start + exec", lifecycle("local", n, unsafe=True)[0])
    print(f"{n} samples each; {os.cpu_count()} CPUs\n" + table(rows))
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
