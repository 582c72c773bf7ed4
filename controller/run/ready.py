"""A run's ready phase: the task's ``[[ready]]`` files, then a stable screen."""

from __future__ import annotations

import time
from typing import Any, Callable

from controller.run.cancel import RunStopped
from controller.run.driver import wait_for_stable_screen
from controller.run.progress import clean
from controller.run.tasks import Task
from controller.run.verify import GuestFileMissing, guest_path


def wait_ready(agent: Any, task: Task, home: str, timeout_s: float, time_scale: float = 1.0,
                cancelled: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """Wait for each ``[[ready]]`` file (its ``timeout_s``, at most ``timeout_s``, both times the
    sandbox's ``time_scale``), then for a stable screen. Returns what was observed. ``cancelled()`` is
    polled between reads (every 0.1 s): raises :class:`RunStopped` once it is true."""
    observed: dict[str, Any] = {}
    for ready in task.ready:
        path = guest_path(ready.file, home)
        limit = min(ready.timeout_s, timeout_s) * time_scale
        deadline = time.monotonic() + limit
        started = time.monotonic()
        while True:
            if cancelled():
                raise RunStopped()
            try:
                agent.read_file(path)
                observed[path] = round(time.monotonic() - started, 3)
                break
            except GuestFileMissing:
                pass
            except Exception as exc:  # 404 from the agent client
                if getattr(exc, "status", None) != 404:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"ready file {path} did not appear within {limit:g}s")
            time.sleep(0.1)  # poll interval: the file is looked for, and the flag, every 0.1 s
    started = time.monotonic()
    observed["screen_stable"] = wait_for_stable_screen(agent, timeout_s=10.0 * time_scale, cancelled=cancelled)
    observed["screen_stable_s"] = round(time.monotonic() - started, 3)
    if cancelled():
        raise RunStopped()
    return observed


def ready_line(observed: dict[str, Any], took_s: float, home: str = "") -> list[str]:
    """``ready in 0.3s: ~/.cache/terminal-ready 0.11s, screen stable 0.22s`` in parts for
    :func:`controller.run.progress.fitted` (a path apart from its time, so that a long path gives way
    first); a path in the guest's ``home`` is shown from ``~``."""
    parts = [f"ready in {took_s:.1f}s: "]
    for path, s in observed.items():
        if path not in ("screen_stable", "screen_stable_s"):
            shown = "~" + path[len(home):] if home and path.startswith(home.rstrip("/") + "/") else path
            parts += [clean(shown, 500), f" {s:.2f}s, "]
    stable = "screen stable" if observed.get("screen_stable") else "screen still changing"
    return [*parts, f"{stable} {observed.get('screen_stable_s', 0.0):.2f}s"]
