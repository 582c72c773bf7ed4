"""CLI: ``report`` reads a record back; ``run-task`` refuses a broken task file before starting anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from controller.record import RunRecord

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path):
    return subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.DEVNULL)


def _record(tmp_path: Path, status: str) -> Path:
    rec = RunRecord(tmp_path, f"run-{status}")
    rec.write("run_started", task={"name": "demo"}, mode="offline")
    rec.write("check", kind="file", target="/home/sandbox/x", rule="text", expected="a", observed="b",
              passed=status == "passed")
    rec.finish(status, "because")
    rec.close()
    return rec.dir


def test_report_prints_the_summary_and_exit_status_follows_the_verdict(tmp_path):
    ok = _cli("report", str(_record(tmp_path, "passed")), cwd=tmp_path)
    assert ok.returncode == 0 and "1/1 passed" in ok.stdout
    bad = _cli("report", str(_record(tmp_path, "failed")), cwd=tmp_path)
    assert bad.returncode == 1 and "FAIL" in bad.stdout
    as_json = _cli("report", str(_record(tmp_path, "cancelled")), "--json", cwd=tmp_path)
    assert '"status": "cancelled"' in as_json.stdout
    missing = _cli("report", str(tmp_path / "nope"), cwd=tmp_path)
    assert missing.returncode == 2


def test_run_task_refuses_a_broken_task_file(tmp_path):
    task = tmp_path / "broken.toml"
    task.write_text('name = "x"\n')
    out = _cli("run-task", str(task), cwd=tmp_path)
    assert out.returncode == 2 and "instructions" in out.stderr
