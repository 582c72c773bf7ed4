"""Benchmark: what the MCP server adds to a screenshot and a click, beside the driver's own path.

``desktop-sandbox bench --mcp [--iterations 50] [--image TAG] [--json FILE]`` (or ``python -m
controller.bench_mcp ...``), on the Docker backend, all in one run:

- **MCP**: ``desktop-sandbox mcp`` over stdio driven by the ``mcp`` package's own client: the
  ``click`` tool, then the ``screenshot`` tool twice (the whole 1280x800 screen, PNG, within the server's
  limits): right after the click (``screenshot_after_input``: the driver's settle wait, about 100 ms,
  comes first) and again (``screenshot``: the capture alone)
  -- JSON-RPC over the pipe, the session's attended run (the approval gate, the record's lines, the
  screenshot saved beside the record), base64 both ways;
- **Python API**: the same two calls through :class:`desktop_sandbox.Sandbox` (the attended run without
  MCP);
- **driver**: :class:`controller.run.driver.SandboxDriver` on a sandbox of the same spec (``capture()``
  and ``click``: the agent client through the relay, nothing recorded) -- the floor the others add to.

Each round takes one sample of every path in turn (interleaved, so the host's noise falls on all of them);
p50/p95 in ms and each path's p50 minus the driver's. Target: MCP adds at most
:data:`TARGET_OVERHEAD_MS` at p50 to a click and to a screenshot (the capture alone: the settle wait's
own spread is larger than the figure measured). Not a test: figures depend on the host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from controller.bench_sampling import percentiles

TARGET_OVERHEAD_MS = 5.0
"""Most milliseconds the MCP server may add, at p50, to a screenshot or a click over the driver's path."""
LABEL = "desktop-sandbox.bench"
REPO = Path(__file__).resolve().parents[1]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _mcp_samples(iterations: int, image: str, runs_dir: Path, other: Any) -> dict[str, list[float]]:
    """Time the MCP tools and, interleaved, ``other(kind)`` (a blocking call per path)."""
    from mcp import Client, StdioServerParameters

    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["PYTHONPATH"] = str(REPO)
    params = StdioServerParameters(command=sys.executable, args=["-m", "controller.cli", "mcp", "--image", image,
                                                                  "--runs-dir", str(runs_dir)],
                                   cwd=str(REPO), env=env)
    samples: dict[str, list[float]] = {}

    def keep(name: str, started: float) -> None:
        samples.setdefault(name, []).append((time.perf_counter() - started) * 1000)

    async with Client(params) as client:
        first = await client.call_tool("screenshot", {})  # starts the session's sandbox
        if first.is_error:
            raise RuntimeError(f"the MCP server's first screenshot failed: {first.content}")
        for i in range(iterations):
            x, y = 600 + i % 40, 400 + i % 40
            for name, tool, args in (("mcp_click", "click", {"x": x, "y": y}),
                                     ("mcp_screenshot_after_input", "screenshot", {}),
                                     ("mcp_screenshot", "screenshot", {})):
                t = time.perf_counter()
                result = await client.call_tool(tool, args)
                keep(name, t)
                assert not result.is_error, result.content
            for name, value in other(x, y).items():
                samples.setdefault(name, []).append(value)
    return samples


def run(iterations: int, image: str) -> dict[str, Any]:
    """Every path measured in one run; the report (``figures``: ms p50/p95 per path and call,
    ``overhead_ms``: p50 minus the driver's, ``checks``: the targets)."""
    from controller.run.driver import ScreenshotPolicy, SandboxDriver
    from controller.run.mapping import Frame, ModelSpace
    from desktop_sandbox import Sandbox

    labels = {"extra_labels": {LABEL: "mcp"}}
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        with Sandbox.start(image=image, runs_dir=Path(tmp), options=labels) as api, \
                Sandbox.start(image=image, runs_dir=Path(tmp), options=labels) as floor:
            # the MCP server's screenshot: the whole screen, PNG, under its limits (1280x800 fits them)
            policy = ScreenshotPolicy(max_width=1568, max_height=1568, max_bytes=750_000)
            driver = SandboxDriver(floor.backend.agent, policy, capture_with_last_action=False)
            driver.model_space = ModelSpace(1280, 800, Frame(0, 0, 1280, 800))

            def api_shot() -> Any:
                return api.screenshot(max_width=1568, max_height=1568, max_bytes=750_000)

            def other(x: int, y: int) -> dict[str, float]:
                out = {}
                for name, call in (("driver_click", lambda: driver.click({"type": "click", "x": x, "y": y,
                                                                          "button": "left"})),
                                   ("driver_screenshot_after_input", driver.capture),
                                   ("driver_screenshot", driver.capture),
                                   ("api_click", lambda: api.click(x, y)),
                                   ("api_screenshot_after_input", api_shot),
                                   ("api_screenshot", api_shot)):
                    t = time.perf_counter()
                    call()
                    out[name] = (time.perf_counter() - t) * 1000
                return out

            _say(f"bench --mcp: {iterations} rounds of MCP, Python API and driver screenshot + click")
            samples = asyncio.run(_mcp_samples(iterations, image, Path(tmp), other))
    figures = {name: percentiles(values) for name, values in sorted(samples.items())}
    overhead = {}
    for path in ("mcp", "api"):
        for call in ("screenshot", "screenshot_after_input", "click"):
            overhead[f"{path}_{call}"] = round(figures[f"{path}_{call}"]["p50"] - figures[f"driver_{call}"]["p50"], 2)
    checks = {f"mcp_{call}_overhead_le_{TARGET_OVERHEAD_MS:g}ms": overhead[f"mcp_{call}"] <= TARGET_OVERHEAD_MS
              for call in ("screenshot", "click")}
    return {"iterations": iterations, "figures": figures, "overhead_ms": overhead, "checks": checks}


def print_report(report: dict[str, Any]) -> None:
    print(f"{'path':30} {'p50 ms':>8} {'p95 ms':>8} {'+p50 vs driver':>15}")
    for name, fig in report["figures"].items():
        extra = report["overhead_ms"].get(name)
        shown = f"{extra:+.2f}" if extra is not None else ""
        print(f"{name:30} {fig['p50']:8.2f} {fig['p95']:8.2f} {shown:>15}")
    for name, ok in report["checks"].items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="desktop-sandbox bench --mcp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--image", default="desktop-sandbox:latest")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.iterations, args.image)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    sys.exit(0 if all(main()["checks"].values()) else 1)
