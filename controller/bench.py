"""Benchmark: the guest agent over HTTP against the usual per-action-process baseline, same run.

``python -m controller.bench [--iterations N] [--baseline-iterations M] [--json FILE]`` starts a
private Xvfb 1280x800x24 with a few terminals full of text (a realistic, compressible screen), the
agent as a real subprocess on loopback, and measures wall time per operation (ms, p50/p95):

- ``click+screenshot png`` / ``jpeg``: ``POST /v1/actions`` (one click) then ``GET /v1/screenshot``;
- ``screenshot png``: ``GET /v1/screenshot`` alone;
- ``type 100 ascii`` / ``type 100 unicode``: one ``type`` action into a terminal.

Baseline, the way many tools do it: one ``xdotool`` process per action (``mousemove X Y click 1``,
``type`` with its default per-character delay) and ImageMagick ``import -window root png:-`` /
``jpeg:-`` per screenshot. ``ratio`` = baseline p50 / agent p50.

Targets checked: click+screenshot PNG p50 <= 20 ms and ratio >= 10.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from controller.agent_client import AgentClient
from guest.localrun import AgentProcess, Xvfb

ASCII_100 = ("The quick brown fox jumps over the lazy dog; 0123456789 <>&\"'$ ~!@#%^*()_+{}|:? "
             "Pack my box with five")[:100]
UNICODE_100 = ("café naïve – 日本語のテキスト 😀 Ωμέγα straße "
               "Привет мир ✓ ünïcödé — «quotes» 東京 ¿qué? ") * 2
UNICODE_100 = UNICODE_100[:100]
TARGET_P50_MS = 20.0
TARGET_RATIO = 10.0


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 and p95 (nearest rank) of ``samples`` in ms, rounded to 0.01 ms."""
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {"p50": round(statistics.median(ordered), 2), "p95": round(p95, 2), "n": len(ordered)}


def measure(fn: Callable[[int], Any], iterations: int, warmup: int = 2) -> dict[str, float]:
    """Run ``fn(i)`` ``warmup`` + ``iterations`` times; percentiles of the timed runs."""
    for i in range(warmup):
        fn(i)
    samples = []
    for i in range(iterations):
        start = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - start) * 1000.0)
    return percentiles(samples)


def _decorate(server: Xvfb) -> list[subprocess.Popen[bytes]]:
    """Terminals with text on screen, and one running ``cat > /dev/null`` to receive typing."""
    env = dict(server.env(), LC_ALL="C.UTF-8")
    procs = []
    for i, (x, y) in enumerate([(20, 20), (420, 180), (760, 420)]):
        procs.append(subprocess.Popen(
            ["xterm", "-geometry", f"80x24+{x}+{y}", "-e", "sh", "-c",
             f"ls -la /usr/bin | head -{40 + i * 10}; sleep 100000"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    procs.append(subprocess.Popen(
        ["xterm", "-u8", "-geometry", "100x10+0+600", "-e", "sh", "-c", "stty -echo; cat > /dev/null"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def run_bench(iterations: int = 50, baseline_iterations: int = 20, type_iterations: int = 10,
              baseline: bool = True) -> dict[str, Any]:
    """Start Xvfb + agent, run every case; returns the results dict (see module doc)."""
    server = Xvfb(1280, 800, 24).start()
    procs = _decorate(server)
    agent = AgentProcess(server.display).start()
    client = AgentClient(agent.base_url, agent.token, timeout=60)
    results: dict[str, dict[str, Any]] = {}
    try:
        client.actions([{"type": "wait"}])
        focus = {"type": "click", "x": 300, "y": 660, "button": "left"}  # the typing terminal

        def click(i: int) -> dict[str, Any]:
            return {"type": "click", "x": 1000 + i % 50, "y": 100 + i % 50, "button": "left"}

        agent_cases: dict[str, Callable[[int], Any]] = {
            "click+screenshot png": lambda i: (client.actions([click(i)]), client.screenshot("png")),
            "click+screenshot jpeg": lambda i: (client.actions([click(i)]), client.screenshot("jpeg")),
            "screenshot png": lambda i: client.screenshot("png"),
        }
        for name, fn in agent_cases.items():
            results[name] = {"agent": measure(fn, iterations)}
        client.actions([focus])
        results["type 100 ascii"] = {"agent": measure(
            lambda i: client.actions([{"type": "type", "text": ASCII_100}]), iterations)}
        results["type 100 unicode"] = {"agent": measure(
            lambda i: client.actions([{"type": "type", "text": UNICODE_100}]), iterations)}

        if baseline and shutil.which("xdotool") and shutil.which("import"):
            env = server.env()

            def run(argv: list[str]) -> bytes:
                return subprocess.run(argv, env=env, check=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL).stdout

            def xclick(i: int) -> None:
                run(["xdotool", "mousemove", str(1000 + i % 50), str(100 + i % 50), "click", "1"])

            base_cases: dict[str, tuple[Callable[[int], Any], int]] = {
                "click+screenshot png": (lambda i: (xclick(i), run(["import", "-window", "root", "png:-"])),
                                         baseline_iterations),
                "click+screenshot jpeg": (lambda i: (xclick(i), run(["import", "-window", "root", "jpeg:-"])),
                                          baseline_iterations),
                "screenshot png": (lambda i: run(["import", "-window", "root", "png:-"]), baseline_iterations),
            }
            for name, (fn, n) in base_cases.items():
                results[name]["baseline"] = measure(fn, n, warmup=1)
            client.actions([focus])
            results["type 100 ascii"]["baseline"] = measure(
                lambda i: run(["xdotool", "type", "--", ASCII_100]), type_iterations, warmup=1)
            results["type 100 unicode"]["baseline"] = measure(
                lambda i: run(["xdotool", "type", "--", UNICODE_100]), type_iterations, warmup=1)
            for row in results.values():
                if "baseline" in row and row["agent"]["p50"] > 0:
                    row["ratio"] = round(row["baseline"]["p50"] / row["agent"]["p50"], 1)
        png = results["click+screenshot png"]
        checks = {
            f"click+screenshot png p50 <= {TARGET_P50_MS:g} ms": png["agent"]["p50"] <= TARGET_P50_MS,
        }
        if "ratio" in png:
            checks[f"click+screenshot png >= {TARGET_RATIO:g}x baseline"] = png["ratio"] >= TARGET_RATIO
        return {"screen": "1280x800x24", "transport": "HTTP on 127.0.0.1", "iterations": iterations,
                "results": results, "checks": checks}
    finally:
        client.close()
        agent.stop()
        for p in procs:
            p.kill()
            p.wait()
        server.stop()


def render(report: dict[str, Any]) -> str:
    """The report as a plain-text table."""
    lines = [f"desktop-sandbox bench — {report['screen']}, {report['transport']}, "
             f"{report['iterations']} iterations",
             f"{'operation':24} {'agent p50':>10} {'agent p95':>10} {'baseline p50':>13} {'baseline p95':>13} {'ratio':>7}"]
    for name, row in report["results"].items():
        a, b = row["agent"], row.get("baseline")
        lines.append(f"{name:24} {a['p50']:>10.2f} {a['p95']:>10.2f} "
                     f"{(b['p50'] if b else float('nan')):>13.2f} {(b['p95'] if b else float('nan')):>13.2f} "
                     f"{row.get('ratio', float('nan')):>6.1f}x")
    lines.append("times in ms; ratio = baseline p50 / agent p50")
    for check, ok in report["checks"].items():
        lines.append(f"{'PASS' if ok else 'FAIL'}  {check}")
    return "\n".join(lines)


def _print(report: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(render(report))
        return
    table = Table(title=f"desktop-sandbox bench — {report['screen']}, {report['transport']}")
    for col in ("operation", "agent p50 ms", "agent p95 ms", "baseline p50 ms", "baseline p95 ms", "ratio"):
        table.add_column(col, justify="left" if col == "operation" else "right", no_wrap=True)
    for name, row in report["results"].items():
        a, b = row["agent"], row.get("baseline")
        table.add_row(name, f"{a['p50']:.2f}", f"{a['p95']:.2f}", f"{b['p50']:.2f}" if b else "-",
                      f"{b['p95']:.2f}" if b else "-", f"{row['ratio']:.1f}x" if "ratio" in row else "-")
    console = Console(width=max(110, Console().width))
    console.print(table)
    for check, ok in report["checks"].items():
        console.print(f"[{'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/] {check}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv``, run the benchmark, print the table; returns the report dict."""
    parser = argparse.ArgumentParser(prog="python -m controller.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--baseline-iterations", type=int, default=20)
    parser.add_argument("--type-iterations", type=int, default=10, help="baseline xdotool type runs")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--json", help="also write the report to this file")
    ns = parser.parse_args(argv)
    report = run_bench(ns.iterations, ns.baseline_iterations, ns.type_iterations, baseline=not ns.no_baseline)
    _print(report)
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return report


if __name__ == "__main__":
    report = main()
    sys.exit(0 if all(report["checks"].values()) else 1)
