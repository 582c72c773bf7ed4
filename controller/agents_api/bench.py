"""Benchmark of the local Agents API: session create -> first screenshot event, and the latency of
each step's screenshot from the guest to the program's SSE event, beside ``run-task``'s own step time.

``desktop-sandbox bench --agents-api [--steps 20] [--sessions 3] [--image TAG] [--runs-dir DIR]
[--json FILE]`` (or ``python -m controller.agents_api.bench ...``). On the Docker backend, in one run:

- a task of ``--steps`` scripted steps (each a pointer move and its screenshot, on the terminal's
  desktop; written into the runs folder), served ``--sessions`` times by an in-process server through
  the real openai client: **create -> first screenshot** (from the create call to the first
  ``computer_use_call`` item with a screenshot on the stream, the first message sent right after the
  create) and **event latency** (per step: from the run record's ``screenshot`` line -- the image is
  back from the guest and recorded -- to the SSE event that carries it reaching the program; one clock,
  this host's), and the served turn's **step time** (between consecutive ``screenshot`` lines);
- the same task once through ``run-task``'s runner directly (no server): its step time.

Medians (p50) and p90 in milliseconds. Not a test: figures depend on the host and what else runs.
Exit status (through ``bench``): 0 when every turn completed and every run passed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import time
from pathlib import Path
from typing import Any

from openai import OpenAI

TASK = """name = "agents-api-bench"
instructions = "Move the pointer."
max_steps = {max_steps}

[[launch]]
app = "terminal"
args = ["-T", "Terminal", "-e", "bash", "-c", "mkdir -p ~/.cache && touch ~/.cache/terminal-ready && exec bash --norc -i"]

[[ready]]
file = "~/.cache/terminal-ready"
timeout_s = 60

[[checks]]
kind = "file"
path = "~/.cache/terminal-ready"
match = "regex"
value = "^$"

[offline]
script = "agents-api-bench.offline.jsonl"
"""


def write_task(folder: Path, steps: int) -> Path:
    """The benchmark's task and its offline script (``steps`` moves, then a message) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"actions": [{"type": "move", "x": 100 + 20 * i, "y": 100 + 10 * (i % 7)}]})
             for i in range(steps)]
    lines.append(json.dumps({"message": f"moved the pointer {steps} times"}))
    (folder / "agents-api-bench.offline.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    task = folder / "agents-api-bench.toml"
    task.write_text(TASK.format(max_steps=steps + 2), encoding="utf-8")
    return task


def _ts(entry: dict[str, Any]) -> float:
    return _dt.datetime.fromisoformat(entry["ts"]).timestamp()


def _shots(record: Path) -> list[float]:
    lines = [json.loads(x) for x in record.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [_ts(e) for e in lines if e.get("type") == "screenshot"]


def _steps_ms(shots: list[float]) -> list[float]:
    return [round((b - a) * 1000, 1) for a, b in zip(shots, shots[1:])]


def stats(values: list[float]) -> dict[str, Any]:
    """``{"n", "p50", "p90", "min", "max"}`` (ms), None fields for no values."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "min": None, "max": None}
    ordered = sorted(values)
    return {"n": len(values), "p50": round(statistics.median(ordered), 1),
            "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 1),
            "min": round(ordered[0], 1), "max": round(ordered[-1], 1)}


def served(client: OpenAI, task: Path) -> dict[str, Any]:
    """One session of ``task``: create -> first screenshot (ms), each screenshot event's arrival (unix s),
    the record's path, whether the turn completed, then the session deleted."""
    t0 = time.perf_counter()
    session = client.beta.agents.sessions.create(
        agent={"model": f"offline:{task}", "tools": [{"type": "computer_use", "include_screenshots": True}]},
        environment={"type": "openai_hosted", "desktop": {"enabled": True}})
    first_ms, arrivals, completed = None, [], False
    try:
        with client.beta.agents.sessions.events.stream(session.id) as events:
            client.beta.agents.sessions.events.create(session.id, events=[
                {"type": "agent.session.input.message", "input": "Move the pointer."}])
            for event in events:
                if event.type == "agent.session.turn.item.done" and event.item.type == "computer_use_call" \
                        and event.item.output is not None:
                    arrivals.append(time.time())
                    if first_ms is None:
                        first_ms = round((time.perf_counter() - t0) * 1000, 1)
                if event.type in ("agent.session.turn.completed", "agent.session.turn.failed",
                                  "agent.session.turn.cancelled", "agent.session.failed"):
                    completed = event.type == "agent.session.turn.completed"
                    break
        record = Path(client.beta.agents.sessions.retrieve(session.id).metadata["desktop_sandbox.record"])
    finally:
        client.beta.agents.sessions.delete(session.id)
    return {"session": session.id, "first_screenshot_ms": first_ms, "arrivals": arrivals, "record": record,
            "completed": completed}


def direct(task: Path, image: str, runs_dir: Path) -> dict[str, Any]:
    """``task`` once through run-task's runner (no server): its record and status."""
    import os

    from rich.console import Console

    from controller.run.runner import RunOptions, run_task
    from controller.run.tasks import load_task
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    loaded = load_task(task)

    def open_(t: Any) -> Any:
        return DockerSandbox.start(t.sandbox_spec(), DockerOptions(image=image))

    with open(os.devnull, "w") as quiet:
        outcome = run_task(loaded, open_, RunOptions(runs_dir=runs_dir, live=False, terminal=False),
                           console=Console(file=quiet))
    return {"record": outcome.record_dir / "record.jsonl", "status": outcome.status}


def run(steps: int, sessions: int, image: str, runs_dir: Path, say: Any = print) -> dict[str, Any]:
    """The measurements of the module docstring; the report (JSON-ready)."""
    from controller.agents_api.server import AgentsServer, ServeOptions
    from controller.agents_api.sessions import HubOptions

    task = write_task(runs_dir / "bench-task", steps)
    report: dict[str, Any] = {"steps": steps, "sessions": []}
    latencies: list[float] = []
    served_steps: list[float] = []
    with AgentsServer(ServeOptions(hub=HubOptions(runs_dir=runs_dir, image=image, tasks_dir=task.parent))) as server:
        client = OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
        for i in range(sessions):
            say(f"session {i + 1} of {sessions} ...")
            one = served(client, task)
            shots = _shots(one["record"])
            lat = [round((a - s) * 1000, 1) for s, a in zip(shots, one["arrivals"])]
            latencies += lat[1:]  # the steps; the first look is counted in create -> first screenshot
            served_steps += _steps_ms(shots)
            report["sessions"].append({"session": one["session"], "completed": one["completed"],
                                       "first_screenshot_ms": one["first_screenshot_ms"],
                                       "events": len(one["arrivals"]), "record": str(one["record"])})
        client.close()
    say("the same task through run-task's runner ...")
    alone = direct(task, image, runs_dir)
    report["direct"] = {"status": alone["status"], "record": str(alone["record"])}
    report["create_to_first_screenshot_ms"] = stats([s["first_screenshot_ms"] for s in report["sessions"]
                                                     if s["first_screenshot_ms"] is not None])
    report["event_latency_ms"] = stats(latencies)
    report["served_step_ms"] = stats(served_steps)
    report["run_task_step_ms"] = stats(_steps_ms(_shots(alone["record"])))
    report["checks"] = {"turns_completed": all(s["completed"] for s in report["sessions"]),
                        "run_task_passed": alone["status"] == "passed"}
    return report


def render_lines(report: dict[str, Any]) -> list[str]:
    """The report as a few lines of text."""
    def row(name: str, s: dict[str, Any]) -> str:
        return f"{name:<44} n={s['n']:<4} p50={s['p50']} ms  p90={s['p90']} ms  (min {s['min']}, max {s['max']})"

    return [f"agents API, {report['steps']} steps a turn, {len(report['sessions'])} sessions:",
            row("session create -> first screenshot event", report["create_to_first_screenshot_ms"]),
            row("event latency (screenshot recorded -> SSE)", report["event_latency_ms"]),
            row("step time, served turn", report["served_step_ms"]),
            row("step time, run-task's runner alone", report["run_task_step_ms"])]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line (module docstring); returns the report with ``checks``."""
    parser = argparse.ArgumentParser(prog="desktop-sandbox bench --agents-api", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--image", default="desktop-sandbox:latest")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs") / "bench-agents-api")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 1 <= args.steps <= 200 or not 1 <= args.sessions <= 20:
        parser.error("--steps 1..200, --sessions 1..20")
    report = run(args.steps, args.sessions, args.image, args.runs_dir.resolve(), say=lambda m: print(m, flush=True))
    for line in render_lines(report):
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    raise SystemExit(0 if all(main()["checks"].values()) else 1)
