"""run-suite without Docker: the report builders (JSON, JUnit checked against tests/suite/junit.xsd, the
tables), finding and planning tasks, and the scheduler itself driving a stand-in for ``run-task``
(``fake_run_task.py``: real records, no sandbox) -- results, a crash kept to its own run, cancellation."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from controller import suite
from controller.suite import PlannedRun, RunResult, SuiteOptions

HERE = Path(__file__).resolve().parent
FAKE = HERE / "fake_run_task.py"


def _result(name: str, k: int, status: str, *, wall: float | None = 10.0, steps: int | None = 7,
            reason: str = "") -> RunResult:
    planned = PlannedRun(index=0, task_name=name, task_file=Path(f"tasks/{name}.toml"), repeat=k)
    return RunResult(planned=planned, status=status, reason=reason or status, wall_s=wall, steps=steps,
                     sandbox_start_s=2.0 if wall else None, record_dir=Path(f"runs/{name}-{k}") if wall else None,
                     log=Path(f"runs/suite/logs/{name}-{k}.log"), pid=1000 + k, exit_code=0)


def _report(results: list[RunResult], cancelled: bool = False) -> dict:
    return suite.build_report(results, suite_id="suite-x", started_at="2030-05-17T12:00:00.000+00:00", wall_s=42.5,
                              parallel=2, repeat=2, backend="docker", cancelled=cancelled, host="h")


def _junit_schema():
    xmlschema = pytest.importorskip("xmlschema", reason="xmlschema (test extra) validates the JUnit shape")
    return xmlschema.XMLSchema(str(HERE / "junit.xsd"))


# -- builders -------------------------------------------------------------------------------------------

def test_report_counts_medians_and_status():
    results = [_result("pickup", 1, "passed", wall=10.0, steps=7), _result("pickup", 2, "passed", wall=20.0, steps=9),
               _result("pickup", 3, "failed", wall=30.0, steps=8), _result("other", 1, "not_started", wall=None,
                                                                            steps=None)]
    report = _report(results)
    assert report["format"] == suite.REPORT_FORMAT and report["status"] == "failed"
    assert report["counts"] == {"passed": 2, "failed": 1, "error": 0, "cancelled": 0, "not_started": 1, "total": 4}
    pickup, other = report["tasks"]
    assert (pickup["task"], pickup["runs"], pickup["passed"]) == ("pickup", 3, 2)
    assert pickup["median_wall_s"] == 20.0 and pickup["median_steps"] == 8.0 and pickup["median_sandbox_start_s"] == 2.0
    assert pickup["statuses"] == {"passed": 2, "failed": 1}
    assert other["median_wall_s"] is None and other["statuses"] == {"not_started": 1}
    assert [r["repeat"] for r in report["runs"]] == [1, 2, 3, 1]
    assert report["runs"][0]["record_dir"] == "runs/pickup-1" and report["runs"][3]["record_dir"] is None
    assert suite.exit_status(report) == 1
    assert json.loads(suite.report_json(report)) == report


def test_exit_status_and_summary_line():
    passed = _report([_result("pickup", k, "passed") for k in (1, 2)])
    assert passed["status"] == "passed" and suite.exit_status(passed) == 0
    assert suite.summary_line(passed) == "2 of 2 runs passed in 42.5s (at most 2 at once)"
    cancelled = _report([_result("pickup", 1, "cancelled"), _result("pickup", 2, "not_started", wall=None)],
                        cancelled=True)
    assert cancelled["status"] == "cancelled" and suite.exit_status(cancelled) == 130
    assert suite.summary_line(cancelled).endswith("; 1 cancelled, 1 not started; cancelled")
    assert suite.exit_status(_report([])) == 1  # nothing ran: not a pass


def test_junit_valid_and_each_status_mapped():
    schema = _junit_schema()
    results = [_result("pickup", 1, "passed"), _result("pickup", 2, "failed", reason="1 of 3 checks failed"),
               _result("pickup", 3, "error", reason="loop stopped"), _result("demo", 1, "cancelled"),
               _result("demo", 2, "not_started", wall=None, steps=None, reason="suite cancelled")]
    data = suite.junit_xml(_report(results))
    assert data.startswith(b"<?xml version='1.0' encoding='utf-8'?>")
    schema.validate(data.decode("utf-8"))
    root = ET.fromstring(data)
    assert root.tag == "testsuites"
    assert {k: root.get(k) for k in ("tests", "failures", "errors", "skipped", "time")} == {
        "tests": "5", "failures": "1", "errors": "2", "skipped": "1", "time": "42.500"}
    pickup, demo = root.findall("testsuite")
    assert (pickup.get("name"), pickup.get("tests"), pickup.get("failures"), pickup.get("errors")) == ("pickup", "3", "1", "1")
    assert pickup.get("time") == "30.000" and pickup.get("timestamp") == "2030-05-17T12:00:00"
    cases = pickup.findall("testcase")
    assert [c.get("name") for c in cases] == ["pickup #1", "pickup #2", "pickup #3"]
    assert cases[0].find("failure") is None and cases[0].find("error") is None
    assert cases[1].find("failure").get("message") == "1 of 3 checks failed"
    assert cases[2].find("error").get("type") == "error"
    assert "record: runs/pickup-1" in cases[0].find("system-out").text
    demo_cases = demo.findall("testcase")
    assert demo_cases[0].find("error").get("type") == "cancelled"
    assert demo_cases[1].find("skipped").get("message") == "suite cancelled"
    assert "None" not in demo_cases[1].find("system-out").text  # a run never started: no steps, no checks


def test_junit_schema_rejects_a_wrong_shape():
    """The schema check can fail: a testcase without its counts' parent, or two outcomes in one case."""
    schema = _junit_schema()
    assert not schema.is_valid("<testsuites tests='1' failures='0' errors='0'><testcase name='a' classname='b' "
                               "time='1'/></testsuites>")
    assert not schema.is_valid("<testsuites tests='1' failures='1' errors='1'><testsuite name='s' tests='1' "
                               "failures='1' errors='1'><testcase name='a' classname='b' time='1'><failure/><error/>"
                               "</testcase></testsuite></testsuites>")


def test_junit_text_from_the_guest_is_made_printable():
    schema = _junit_schema()
    nasty = "bad \x1b[31m\x00 \u202e reason <x> & 'q'"
    data = suite.junit_xml(_report([_result("t\x07", 1, "failed", reason=nasty)]))
    schema.validate(data.decode("utf-8"))
    failure = ET.fromstring(data).find("testsuite/testcase/failure")
    assert "\x1b" not in failure.get("message") and "\\x1b" in failure.get("message")
    assert "<x> & 'q'" in failure.get("message")  # escaped by ElementTree, read back as written


def test_task_table_renders_every_task():
    report = _report([_result("pickup", 1, "passed"), _result("pickup", 2, "failed"), _result("demo", 1, "passed")])
    console = Console(record=True, width=200)
    console.print(suite.task_table(report))
    text = console.export_text()
    assert "pickup" in text and "1/2" in text and "failed 1" not in text and "1 failed" in text
    assert "demo" in text and "1/1" in text and "10.0s" in text


# -- finding and planning ---------------------------------------------------------------------------------

def test_find_task_files_folders_files_and_refusals(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.toml").write_text("")
    (tmp_path / "a" / "sub").mkdir()
    (tmp_path / "a" / "sub" / "y.toml").write_text("")
    (tmp_path / "a" / "notes.txt").write_text("")
    found = suite.find_task_files([tmp_path / "a", tmp_path / "a" / "x.toml"])
    # sorted under a folder, each file once however often it is named
    assert found == [(tmp_path / "a" / "sub" / "y.toml").resolve(), (tmp_path / "a" / "x.toml").resolve()]
    with pytest.raises(suite.SuiteError, match="no such file"):
        suite.find_task_files([tmp_path / "missing.toml"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(suite.SuiteError, match="no \\*.toml"):
        suite.find_task_files([tmp_path / "empty"])


def test_plan_is_repeat_major():
    plan = suite.plan_runs([("a", Path("a.toml")), ("b", Path("b.toml"))], 2)
    assert [(p.task_name, p.repeat, p.index) for p in plan] == [("a", 1, 0), ("b", 1, 1), ("a", 2, 2), ("b", 2, 3)]
    assert plan[0].key == "001-a-1" and plan[3].label == "b #2"
    with pytest.raises(ValueError):
        suite.plan_runs([("a", Path("a.toml"))], 0)


def test_run_command_is_run_task():
    planned = PlannedRun(0, "pickup", Path("/t/pickup.toml"), 1)
    argv = suite.run_command(planned, SuiteOptions(runs_dir=Path("runs"), backend="docker", image="img:1",
                                                   live=False, cli=["py", "-m", "controller.cli"]))
    assert argv == ["py", "-m", "controller.cli", "run-task", "/t/pickup.toml", "--runs-dir", "runs",
                    "--backend", "docker", "--image", "img:1", "--offline"]


# -- the scheduler, against the stand-in --------------------------------------------------------------------

def _tasks(tmp_path: Path, *names: str) -> list[tuple[str, Path]]:
    out = []
    for name in names:
        path = tmp_path / f"{name}.toml"
        path.write_text(f'name = "{name}"\n', encoding="utf-8")
        out.append((name, path))
    return out


def _runner(tmp_path: Path, plan: list[PlannedRun], parallel: int) -> suite.SuiteRunner:
    options = SuiteOptions(parallel=parallel, runs_dir=tmp_path / "runs", cli=[sys.executable, str(FAKE)],
                           run_timeout_s=60)
    return suite.SuiteRunner(plan, options, repeat=1, console=Console(file=open("/dev/null", "w")))


def test_runs_in_parallel_and_a_crash_stays_its_own(tmp_path):
    plan = suite.plan_runs(_tasks(tmp_path, "pass-a", "crash-b", "fail-c", "pass-d"), 1)
    runner = _runner(tmp_path, plan, parallel=2)
    report = runner.run()
    by = {r["task"]: r for r in report["runs"]}
    assert by["pass-a"]["status"] == "passed" and by["pass-d"]["status"] == "passed"
    assert by["pass-a"]["steps"] == 3 and by["pass-a"]["sandbox_start_s"] == 0.25
    assert by["fail-c"]["status"] == "failed" and by["fail-c"]["reason"] == "1 of 3 checks failed"
    assert by["crash-b"]["status"] == "error" and "exit status 3" in by["crash-b"]["reason"]
    assert by["crash-b"]["exit_code"] == 3 and by["pass-a"]["exit_code"] == 0
    for run in report["runs"]:
        assert Path(run["log"]).exists() and run["pid"]
        assert Path(run["record_dir"], "record.jsonl").exists()
        assert Path(run["record_dir"]).parent == tmp_path / "runs"
    assert suite.exit_status(report) == 1
    assert json.loads(runner.index_path.read_text()) == report  # the index is the final report


def test_cancel_passes_the_signal_on_and_starts_nothing_more(tmp_path):
    plan = suite.plan_runs(_tasks(tmp_path, "hang-a", "hang-b", "pass-c"), 1)
    runner = _runner(tmp_path, plan, parallel=2)
    runs = tmp_path / "runs"

    def cancel_when_both_wait() -> None:
        deadline = time.monotonic() + 60
        while len(list(runs.glob("*.waiting"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # poll interval: waiting for two files to appear
        runner.cancel(signal.SIGTERM)

    helper = threading.Thread(target=cancel_when_both_wait, daemon=True)
    helper.start()
    report = runner.run()
    helper.join(5)
    by = {r["task"]: r for r in report["runs"]}
    assert by["hang-a"]["status"] == by["hang-b"]["status"] == "cancelled"
    assert by["hang-a"]["reason"] == "cancelled by SIGTERM"
    assert by["pass-c"]["status"] == "not_started" and by["pass-c"]["pid"] is None
    assert report["cancelled"] and suite.exit_status(report) == 130
    assert sum(1 for r in report["runs"] if r["record_dir"]) == 2


def test_outcome_without_record_or_unfinished(tmp_path):
    result = _result("x", 1, "running")
    result.record_dir, result.exit_code = None, -9
    suite.outcome_from_record(result)
    assert result.status == "error" and result.reason == "no run record (killed by SIGKILL)"
    result.record_dir = tmp_path / "none"
    suite.outcome_from_record(result)
    assert result.status == "error" and result.reason.startswith("run record unreadable (killed by SIGKILL)")


def test_live_display_on_a_terminal(tmp_path):
    """On a terminal the runs going are shown live (rich), then the counts; the display reads each run's
    record as it grows."""
    import io

    plan = suite.plan_runs(_tasks(tmp_path, "pass-a", "fail-b"), 1)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    options = SuiteOptions(parallel=2, runs_dir=tmp_path / "runs", cli=[sys.executable, str(FAKE)], run_timeout_s=60)
    runner = suite.SuiteRunner(plan, options, console=console)
    progress = suite._Progress()
    report = runner.run()
    text = out.getvalue()
    assert "2 of 2 done, 1 passed, 0 running, 0 queued" in text
    assert "passed pass-a #1" in text and "failed fail-b #1" in text
    assert "[bold]" not in text and "[/]" not in text  # the header is styled, never shown as markup
    # the step counter reads the record incrementally
    result = runner.results[0]
    runner._update_progress(result, progress)
    assert (progress.steps, progress.phase) == (3, "finished")
    assert report["counts"]["passed"] == 1
