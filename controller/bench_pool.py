"""Benchmark: a warm pool beside cold starts, on the Docker backend, all measured in one run.

``desktop-sandbox bench --pool [--samples N] [--runs N] [--claims 20] [--size 4] [--task tasks/pickup.toml]
[--image TAG] [--runs-dir DIR] [--json FILE]`` (or ``python -m controller.bench_pool ...``).

- **idle footprint**: one pool sandbox waiting for a claim (deny-all, nothing launched): memory of its
  desktop and gateway containers as ``docker stats`` shows it (MiB), a few samples, and the default
  pool size this host gets from it (:func:`controller.sandbox.pool.default_size`).
- **first screenshot**: seconds from the request for a sandbox to the first screenshot in hand, cold
  (``DockerSandbox.start`` with the task's spec) and on a pool hit (``WarmPool.claim``: the agent's
  fresh token, the policy swap), ``--samples`` of each, interleaved; p50, p95, ratio.
- **pickup run**: the offline task run end to end by ``run-task`` as a person runs it (a process of its
  own: interpreter start, imports, the run, teardown, the record), cold and with ``--pool SOCKET`` on a
  keeper holding a ready sandbox, ``--runs`` of each, interleaved; wall p50 and each run's status.
- **claims at once**: ``--claims`` runs of the task at once (``run-task`` processes, as ``run-suite
  --parallel`` runs them) claiming from a pool of ``--size``: every status, distinct sandboxes, pool hits
  and cold starts as the pool counted them, and what is left on the engine afterwards (nothing).

Not a test: figures depend on the host and what else runs on it. Exit status (through ``bench``): 0 when
every run passed and nothing was left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from controller.bench_sampling import percentiles

LABEL = "desktop-sandbox.bench"
REPO = Path(__file__).resolve().parents[1]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _options(image: str) -> Any:
    from controller.sandbox.docker import DockerOptions

    return DockerOptions(image=image, extra_labels={LABEL: "pool"})


def idle_footprint(image: str, samples: int = 5) -> dict[str, Any]:
    """One pool sandbox idle: ``{"desktop_mib", "gateway_mib", "sandbox_mib"}`` medians, ``default_size``."""
    import docker

    from controller.bench_suite import memory_mib
    from controller.sandbox.docker import DockerSandbox
    from controller.sandbox.pool import Template, WarmPool, default_size

    client = docker.from_env()
    with WarmPool(DockerSandbox, _options(image), [Template()], 1) as pool:
        if not pool.wait_ready(1, timeout=300):
            raise RuntimeError("the pool sandbox did not become ready")
        sandbox = pool._ready[Template()][0]
        _settled_memory(client, f"{sandbox.id}-desktop", memory_mib)
        rows: dict[str, list[float]] = {"desktop": [], "gateway": []}
        for _ in range(samples):
            for role in rows:
                stats = client.containers.get(f"{sandbox.id}-{role}").stats(stream=False, one_shot=True)
                value = memory_mib(stats)
                if value is not None:
                    rows[role].append(value)
            time.sleep(0.5)  # spacing of the samples
    desktop, gateway = statistics.median(rows["desktop"]), statistics.median(rows["gateway"])
    total = round(desktop + gateway, 1)
    return {"desktop_mib": desktop, "gateway_mib": gateway, "sandbox_mib": total,
            "default_size": default_size(int(total) + 1)}


def _settled_memory(client: Any, container: str, memory_mib: Callable[[dict[str, Any]], Any],
                    timeout: float = 20.0) -> None:
    """Wait until ``container``'s memory changes by less than 2 MiB between two samples (the desktop
    settling after its start: fonts, the session's first paint), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        now = memory_mib(client.containers.get(container).stats(stream=False, one_shot=True))
        if now is not None and last is not None and abs(now - last) < 2.0:
            return
        last = now
        time.sleep(0.5)  # sampling interval of a condition wait, bounded by the deadline


def first_screenshot(image: str, task: Any, samples: int) -> dict[str, Any]:
    """Seconds from asking for a sandbox to the first screenshot, cold and on a pool hit, interleaved."""
    from controller.sandbox.docker import DockerSandbox
    from controller.sandbox.pool import Template, WarmPool

    spec = task.sandbox_spec()
    cold: list[float] = []
    hit: list[float] = []
    claims: list[float] = []
    with WarmPool(DockerSandbox, _options(image), [Template.of(spec)], 1) as pool:  # no apps: the bare start
        for i in range(samples):
            if not pool.wait_ready(1, timeout=300):
                raise RuntimeError("the pool did not refill")
            t0 = time.monotonic()
            sandbox = pool.claim(spec)
            sandbox.agent.screenshot()
            hit.append(time.monotonic() - t0)
            claims.append(sandbox.provenance["claim_s"])
            assert sandbox.provenance["source"] == "pool"
            sandbox.close()
            t0 = time.monotonic()
            with DockerSandbox.start(spec, _options(image)) as fresh:
                fresh.agent.screenshot()
                cold.append(time.monotonic() - t0)
            _say(f"  first screenshot {i + 1}/{samples}: cold {cold[-1]:.2f}s, pool hit {hit[-1] * 1000:.0f} ms")
    out = {"cold_ms": percentiles([v * 1000 for v in cold]), "pool_ms": percentiles([v * 1000 for v in hit]),
           "claim_ms": percentiles([v * 1000 for v in claims])}
    out["ratio"] = round(out["cold_ms"]["p50"] / out["pool_ms"]["p50"], 1)
    return out


def _run_task(task_file: Path, runs_dir: Path, image: str, pool: Path | None) -> tuple[float, int, str]:
    """One ``run-task`` process: (wall seconds, exit status, record path)."""
    argv = [sys.executable, "-m", "controller.cli", "run-task", str(task_file), "--offline", "--runs-dir",
            str(runs_dir), "--image", image, *(["--pool", str(pool)] if pool else [])]
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          timeout=600)
    return time.monotonic() - t0, done.returncode, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def pickup_runs(image: str, task_file: Path, task: Any, runs: int, runs_dir: Path) -> dict[str, Any]:
    """``run-task`` of the task, cold and on a pool hit (``--pool``), ``runs`` of each, interleaved."""
    from controller.sandbox.docker import DockerSandbox
    from controller.sandbox.pool import Template, WarmPool
    from controller.sandbox.pool_keeper import PoolKeeper

    template = Template.of(task.sandbox_spec(), *task.pool_apps())
    cold: list[float] = []
    hit: list[float] = []
    statuses: list[int] = []
    sources: list[str] = []
    with WarmPool(DockerSandbox, _options(image), [template], 1) as pool, PoolKeeper(pool) as keeper:
        for i in range(runs):
            if not pool.wait_ready(1, timeout=300):
                raise RuntimeError("the pool did not refill")
            wall, status, record = _run_task(task_file, runs_dir, image, keeper.path)
            hit.append(wall)
            statuses.append(status)
            sources.append(_claim_source(record))
            wall_cold, status_cold, _ = _run_task(task_file, runs_dir, image, None)
            cold.append(wall_cold)
            statuses.append(status_cold)
            _say(f"  pickup run {i + 1}/{runs}: cold {wall_cold:.2f}s (exit {status_cold}), "
                 f"pool hit {wall:.2f}s (exit {status}, {sources[-1]})")
    out = {"cold_s": percentiles(cold), "pool_s": percentiles(hit), "statuses": statuses, "sources": sources}
    out["ratio"] = round(out["cold_s"]["p50"] / out["pool_s"]["p50"], 2)
    return out


def _claim_source(record: str) -> str:
    try:
        first = json.loads(Path(record).read_text(encoding="utf-8").splitlines()[0])
    except (OSError, ValueError, IndexError):
        return "?"
    return (first.get("claim") or {}).get("source", "none")


def claims_at_once(image: str, task_file: Path, task: Any, claims: int, size: int, runs_dir: Path) -> dict[str, Any]:
    """``claims`` ``run-task`` processes at once on a pool of ``size``: statuses, sandboxes, counts, leftovers."""
    import docker

    from controller.sandbox import LABEL_SANDBOX
    from controller.sandbox.docker import DockerSandbox
    from controller.sandbox.pool import Template, WarmPool
    from controller.sandbox.pool_keeper import PoolKeeper

    template = Template.of(task.sandbox_spec(), *task.pool_apps())
    results: list[tuple[float, int, str]] = []
    lock = threading.Lock()
    with WarmPool(DockerSandbox, _options(image), [template], size) as pool, PoolKeeper(pool) as keeper:
        if not pool.wait_ready(size, timeout=600):
            raise RuntimeError("the pool did not fill")
        _say(f"  pool of {size} ready; {claims} runs at once")

        def one() -> None:
            got = _run_task(task_file, runs_dir, image, keeper.path)
            with lock:
                results.append(got)

        threads = [threading.Thread(target=one) for _ in range(claims)]
        t0 = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(900)
        wall = time.monotonic() - t0
        stats = pool.stats.as_dict()
    sandboxes = []
    for _wall, _status, record in results:
        try:
            sandboxes.append(json.loads(Path(record).read_text(encoding="utf-8").splitlines()[0]).get("sandbox"))
        except (OSError, ValueError, IndexError):
            sandboxes.append(None)
    client = docker.from_env()
    left = [c.name for c in client.containers.list(all=True, filters={"label": [f"{LABEL}=pool", LABEL_SANDBOX]})]
    return {"claims": claims, "size": size, "wall_s": round(wall, 1),
            "passed": sum(1 for _w, status, _r in results if status == 0), "statuses": [r[1] for r in results],
            "distinct_sandboxes": len({s for s in sandboxes if s}), "hits": stats["hits"], "cold": stats["cold"],
            "cold_reasons": stats["cold_reasons"], "run_wall_s": percentiles([r[0] for r in results]),
            "left_behind": left}


def run(image: str, task_file: Path, samples: int, runs: int, claims: int, size: int, runs_dir: Path) -> dict[str, Any]:
    from controller.run.tasks import load_task

    task = load_task(task_file)
    report: dict[str, Any] = {"image": image, "task": str(task_file), "host_cores": os.cpu_count()}
    _say("pool bench: idle footprint")
    report["idle"] = idle_footprint(image)
    _say("pool bench: first screenshot, cold vs pool hit")
    report["first_screenshot"] = first_screenshot(image, task, samples)
    _say("pool bench: run-task of the task, cold vs pool hit")
    report["pickup"] = pickup_runs(image, task_file, task, runs, runs_dir)
    if claims:
        _say(f"pool bench: {claims} claims at once from a pool of {size}")
        report["at_once"] = claims_at_once(image, task_file, task, claims, size, runs_dir)
    at_once = report.get("at_once") or {}
    report["checks"] = {
        "pickup_passed": all(s == 0 for s in report["pickup"]["statuses"]),
        "pickup_pool_hits": all(s == "pool" for s in report["pickup"]["sources"]),
        "at_once_passed": not at_once or at_once["passed"] == at_once["claims"],
        "at_once_distinct": not at_once or at_once["distinct_sandboxes"] == at_once["claims"],
        "nothing_left": not at_once or not at_once["left_behind"],
    }
    return report


def render_lines(report: dict[str, Any]) -> list[str]:
    idle, shot, pickup = report["idle"], report["first_screenshot"], report["pickup"]
    lines = [
        f"pool idle footprint: {idle['sandbox_mib']} MiB a sandbox (desktop {idle['desktop_mib']}, gateway "
        f"{idle['gateway_mib']}); default pool size on this host: {idle['default_size']}",
        f"first screenshot: cold p50 {shot['cold_ms']['p50']:.0f} ms (p95 {shot['cold_ms']['p95']:.0f}), pool hit "
        f"p50 {shot['pool_ms']['p50']:.0f} ms (p95 {shot['pool_ms']['p95']:.0f}; claim p50 "
        f"{shot['claim_ms']['p50']:.0f} ms): x{shot['ratio']}",
        f"run-task {Path(report['task']).name}: cold p50 {pickup['cold_s']['p50']:.2f} s, pool hit p50 "
        f"{pickup['pool_s']['p50']:.2f} s (p95 {pickup['pool_s']['p95']:.2f}): x{pickup['ratio']}",
    ]
    at_once = report.get("at_once")
    if at_once:
        lines.append(f"{at_once['claims']} runs at once, pool of {at_once['size']}: {at_once['passed']} passed, "
                     f"{at_once['distinct_sandboxes']} distinct sandboxes, {at_once['hits']} pool hits, "
                     f"{at_once['cold']} cold starts {at_once['cold_reasons']}, in {at_once['wall_s']} s; "
                     f"left behind: {len(at_once['left_behind'])}")
    lines.append("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in report["checks"].items()))
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from controller.sandbox.docker import DEFAULT_IMAGE

    parser = argparse.ArgumentParser(prog="desktop-sandbox bench --pool", description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10, help="first-screenshot samples of each kind")
    parser.add_argument("--runs", type=int, default=3, help="run-task runs of each kind")
    parser.add_argument("--claims", type=int, default=20, help="runs at once on the pool (0: skip)")
    parser.add_argument("--size", type=int, default=4, help="pool size for the runs at once")
    parser.add_argument("--task", type=Path, default=REPO / "tasks" / "pickup.toml")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--runs-dir", type=Path, default=None, help="where the runs' records go (default: a "
                                                                    "temporary folder)")
    parser.add_argument("--json", help="also write the report to this file")
    ns = parser.parse_args(argv)
    runs_dir = ns.runs_dir or Path(tempfile.mkdtemp(prefix="bench-pool-"))
    report = run(ns.image, ns.task.resolve(), ns.samples, ns.runs, ns.claims, ns.size, runs_dir)
    for line in render_lines(report):
        print(line)
    if ns.json:
        Path(ns.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return report


if __name__ == "__main__":
    result = main()
    sys.exit(0 if all(result["checks"].values()) else 1)
