"""Stands in for ``python -m controller.cli run-task TASK --runs-dir DIR`` in the suite's unit tests, where
no sandbox can start quickly: it writes a real run record (controller.run.record) and behaves as the task's
name says, so the suite's scheduling, cancellation and crash handling are tested without Docker.

Task name prefix: ``pass`` (3 steps, passed, exit 0), ``fail`` (failed, exit 1), ``crash`` (writes
``run_started`` and dies without finishing the record, exit 3), ``hang`` (writes ``run_started``, creates
``<runs>/<pid>.waiting``, waits for SIGINT/SIGTERM/SIGHUP -- at most 60 s -- then finishes ``cancelled``
naming the signal, exit 130). Run as ``python fake_run_task.py run-task TASK --runs-dir DIR``.
"""

import os
import signal
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from controller.run.entries import ModelResponse, RunStarted, TaskRef  # noqa: E402
from controller.run.record import RunRecord, new_run_id  # noqa: E402


def main(argv: list[str]) -> int:
    assert argv[0] == "run-task", argv
    task_file = Path(argv[1])
    runs = Path(argv[argv.index("--runs-dir") + 1])
    name = tomllib.loads(task_file.read_text(encoding="utf-8"))["name"]
    got: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda signum, _f: got.append(signum))
    t0 = time.monotonic()
    record = RunRecord(runs, new_run_id(name))
    print(f"run-task {name} (offline) -> {record.dir}", file=sys.stderr, flush=True)
    record.write(RunStarted(task=TaskRef(name=name, source=str(task_file)), mode="offline", sandbox="ds-00000000",
                            sandbox_start_s=0.25))
    kind = name.split("-")[0]
    if kind == "crash":
        os._exit(3)
    if kind == "hang":
        (runs / f"{os.getpid()}.waiting").touch()
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)  # poll interval: the handler only appends to a list
        status, reason, code = "cancelled", f"cancelled by {signal.Signals(got[0]).name if got else 'nothing'}", 130
    else:
        for i in range(3):
            record.write(ModelResponse(response_id=f"r{i}", http_status=200))
        status, reason, code = ("passed", "3 of 3 checks", 0) if kind == "pass" else ("failed", "1 of 3 checks failed", 1)
    record.finish(status, reason, timings={"sandbox_start": 0.25}, wall_s=round(time.monotonic() - t0 + 1.0, 3))
    record.close()
    print(record.path)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
