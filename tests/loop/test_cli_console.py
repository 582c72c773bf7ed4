"""``desktop-sandbox run-task`` as a user sees it, piped (no terminal): the real CLI in a subprocess,
its sandbox a local desktop (Xvfb + the real agent, tests/loop/local_sandbox.py) instead of a
container, the real SDK loop against the scripted server. The console shows each step, each
computer_call's actions (typed text only as a length), approvals, checks with what was observed, the
verdict and the record path; ``report --json`` gives each check's detail; Ctrl-C exits 130."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len

from controller.run.record import read_entries
from tests.loop.conftest import interrupt_after_first_action

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Tr0ub4dor&3-horse-battery"

# The CLI with one change: run-task opens a local desktop instead of a Docker sandbox. Everything
# else (options, console, runner, record, exit status) is the command line's own.
CLI_CHILD = r"""
import sys
from controller import cli
from tests.loop.local_sandbox import LocalSandbox

def local_opener(backend, image_tag):
    def open_sandbox(task):
        sb = LocalSandbox().start()
        (sb.home / "Documents" / "seed.txt").write_text("seed\n")
        return sb
    return open_sandbox

cli.sandbox_opener = local_opener
cli.app(sys.argv[1:], prog_name="desktop-sandbox")
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for key in ("OPENAI_API_KEY", "COLUMNS", "FORCE_COLOR"):
        env.pop(key, None)
    return env


def _task(tmp_path: Path, turns: list[dict], checks: str) -> Path:
    (tmp_path / "script.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    task = tmp_path / "console.toml"
    task.write_text('name = "console"\ninstructions = "type a secret"\nmax_steps = 50\n'
                    f'{checks}\n[offline]\nscript = "script.jsonl"\n')
    return task


SEED_CHECK = '[[checks]]\nkind = "file"\npath = "~/Documents/seed.txt"\nmatch = "text"\nvalue = "seed"\n'
MISSING_CHECK = '[[checks]]\nkind = "file"\npath = "~/Documents/never.txt"\nmatch = "text"\nvalue = "x"\n'


def _run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI_CHILD, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env=_env(), stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_run_task_prints_each_step_its_actions_approvals_checks_and_verdict(tmp_path):
    turns = [
        {"actions": [{"type": "click", "x": 640, "y": 250, "button": "left"},
                     {"type": "type", "text": SECRET},
                     {"type": "keypress", "keys": ["CTRL", "C"]}],
         "pending_safety_checks": [{"id": "sc_1", "code": "sensitive_action", "message": "about to type"}]},
        {"actions": [{"type": "scroll", "x": 300, "y": 400, "scroll_x": 0, "scroll_y": -300},
                     {"type": "move", "x": 5, "y": 6}]},
        {"message": "done"},
    ]
    task = _task(tmp_path, turns, SEED_CHECK)
    runs = tmp_path / "runs"
    done = _run_cli(tmp_path, "run-task", str(task), "--offline", "--runs-dir", str(runs),
                    "--approve-safety-check", "sensitive_action")
    assert done.returncode == 0, done.stderr
    err = done.stderr
    lines = err.splitlines()
    # as the run goes, one line each
    assert any(l.startswith("sandbox local-") and " started in " in l for l in lines), err
    assert any(l.startswith("step 1 resp_") and "tokens (in " in l for l in lines), err
    assert any(l.startswith("step 2 resp_") for l in lines), err
    # a line longer than 100 columns gives way in its longest part (the actions), not in the checks
    (call_1,) = [l for l in lines if l.strip().startswith("call call_0000:")]
    assert call_1.startswith(f"  call call_0000: click (640,250) left; type <{len(SECRET)} chars>; key"), err
    assert call_1.endswith("… [safety checks: sensitive_action]"), err
    assert "  call call_0001: scroll (300,400) 0,-300; move (5,6)" in lines, err
    assert any("opt-in: safety checks with code sensitive_action" in l for l in lines), err
    assert "  approval: safety check sensitive_action on call_0000 approved (opt-in)" in lines, err
    assert any(l.startswith("check pass file ") and l.endswith("seed.txt text: observed 'seed\\n'") for l in lines), err
    # the summary: decisions counted apart from the opt-in, actions say what they count, verdict wording
    assert "1 approved, 0 denied; opt-in: --approve-safety-check sensitive_action" in err
    assert "5 input actions (0 failed) and 2 screenshot actions" in err and "│ 3 sent " in err
    assert "passed (1 of 1 checks)" in err
    # piped output fits 100 columns, but for the first line, which names the record's folder whole (run-suite
    # reads it); the record path stands whole on stdout
    assert max(cell_len(l) for l in lines[1:]) <= 100 and lines[0].startswith("run-task console (offline) -> "), err
    record = Path(done.stdout.strip())
    assert record.is_file() and record.parent.parent == runs
    # the typed text is nowhere: not on the console, not in the record
    assert SECRET not in err and SECRET not in done.stdout
    assert SECRET not in record.read_text()

    report = subprocess.run([sys.executable, "-m", "controller.cli", "report", str(record.parent), "--json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, env=_env())
    summary = json.loads(report.stdout)
    assert summary["approvals_approved"] == 1 and summary["approvals_opt_in"] == ["sensitive_action"]
    assert summary["checks"] == [{"kind": "file", "target": summary["checks"][0]["target"], "rule": "text",
                                  "expected": "seed", "observed": "seed\n", "passed": True}]
    assert summary["checks"][0]["target"].endswith("/Documents/seed.txt")


@pytest.mark.slow
def test_a_failed_check_on_a_missing_file_says_so_and_report_json_tells_why(tmp_path):
    task = _task(tmp_path, [{"actions": [{"type": "move", "x": 1, "y": 2}]}, {"message": "done"}],
                 SEED_CHECK + MISSING_CHECK)
    done = _run_cli(tmp_path, "run-task", str(task), "--offline", "--runs-dir", str(tmp_path / "runs"))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert any(l.startswith("check FAIL file ") and l.endswith("never.txt text: expected 'x', file missing")
               for l in lines), done.stderr
    assert "observed None" not in done.stderr
    assert "failed (1 of 2 checks failed)" in done.stderr
    record = Path(done.stdout.strip())
    report = subprocess.run([sys.executable, "-m", "controller.cli", "report", str(record), "--json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, env=_env())
    assert report.returncode == 1
    checks = json.loads(report.stdout)["checks"]
    assert [c["passed"] for c in checks] == [True, False]
    missing = checks[1]
    assert missing["kind"] == "file" and missing["target"].endswith("/Documents/never.txt")
    assert (missing["rule"], missing["expected"], missing["observed"]) == ("text", "x", None)
    assert missing["detail"] == "file does not exist"


@pytest.mark.slow
def test_ctrl_c_during_run_task_exits_130(tmp_path):
    turns = [{"actions": [{"type": "move", "x": 10 + i, "y": 10}, {"type": "wait"}]} for i in range(40)]
    task = _task(tmp_path, turns + [{"message": "never"}], SEED_CHECK)
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-c", CLI_CHILD, "run-task", str(task), "--offline", "--runs-dir",
                             str(runs)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), stdin=subprocess.DEVNULL)
    out, err = interrupt_after_first_action(proc, runs)
    assert proc.returncode == 130, err
    assert "cancelled (cancelled by SIGINT)" in err
    entries = read_entries(Path(out.strip()))
    assert entries[-1].status == "cancelled"


def test_run_task_help_documents_the_exit_codes():
    done = subprocess.run([sys.executable, "-m", "controller.cli", "run-task", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=_env())
    assert done.returncode == 0
    lines = [" ".join(l.strip(" │").split()) for l in done.stdout.splitlines()]
    for code, words in (("0", "passed"), ("1", "failed"), ("2", "bad input"), ("130", "cancelled")):
        assert any(l.startswith(f"{code} {words}") for l in lines), (code, done.stdout)
