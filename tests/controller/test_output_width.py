"""A run's output fits 100 columns: its progress lines, the summary table at its end and
``desktop-sandbox report``'s table are never wider, and never wrap (one line an entry, one line a
row), for records of several shapes: the pickup task's (checks with long SQL), long names and reasons,
and hostile text from the guest. Long values are shortened with an ellipsis there, and stay whole in
``report --json`` and the HTML report."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Callable

import pytest
import typer
from markupsafe import escape
from rich.cells import cell_len
from rich.console import Console

from controller.run.bus import follow_entries
from controller.report import render_report
from controller.run.progress import RunPrinter, make_console
from controller.run.record import RunRecord, print_summary, read_entries, summarize, summary_table
from tests.controller.hostile_text import EVIL, assert_shown_safely

PICKUP_SQL = ("rows of: SELECT count(*) FROM pickups WHERE confirmation = ? AND name = 'Ada Lovelace' "
              "AND date = '2030-05-17' AND time_window = '12:00-15:00' AND items = '2 boxes of books'")
LONG_NAME = "book-a-parcel-pickup-then-save-the-confirmation-number-in-the-terminal-" * 3
LONG_REASON = ("loop stopped: APIConnectionError: the model server at http://127.0.0.1:41234/v1/responses "
               "closed the connection while the response was streamed; " * 4)
WIDTH = 100
"""The columns every line of a run's output fits in."""
LONG_URL = "https://pickup.example/book?name=Ada%20Lovelace&date=2030-05-17&window=12%3A00-15%3A00&" + "x=1&" * 40


def _started(rec: RunRecord, name: str) -> None:
    rec.write("run_started", task={"name": name, "source": "tasks/pickup.toml"}, mode="offline", model="scripted",
              image="sha256:" + "b2" * 32, sandbox="ds-bd398961", sandbox_start_s=4.1)


def _step(rec: RunRecord, n: int, actions: list[dict], text: str | None = None) -> None:
    rec.write("expectation", turn=n, call_id=f"call_000{n}", met=True,
              expected=["color #9bbcf0 +-16 in >=60% of 360x3 at (460,168)"])
    rec.write("model_response", response_id=f"resp_000{n}_458af12a0cad", http_status=200, text=text,
              usage={"input_tokens": 1256 * (n + 1), "output_tokens": 49, "total_tokens": 1305 * (n + 1)})
    rec.write("computer_call", call_id=f"call_000{n}", form="actions", actions=actions, pending_checks=[])
    for action in actions:
        rec.write("action", call_id=f"call_000{n}", action=action["type"], duration_ms=18.2)


def pickup(rec: RunRecord) -> None:
    """The pickup task's run as the offline script makes it: a call of eight actions, checks whose rule
    is a whole SQL query, five timed phases."""
    _started(rec, "pickup")
    rec.write("network", seq=1, origin="https://firefox.settings.services.mozilla.com", decision="deny",
              reason="deny-all", via="connect")
    _step(rec, 0, [{"type": "click", "x": 640, "y": 194, "button": "left"}])
    _step(rec, 1, [{"type": "type", "text_length": 12}, {"type": "keypress", "keys": ["Tab"]},
                   {"type": "type", "text_length": 10}, {"type": "keypress", "keys": ["Tab"]},
                   {"type": "keypress", "keys": ["Right"]}, {"type": "keypress", "keys": ["Tab"]},
                   {"type": "type", "text_length": 16}, {"type": "keypress", "keys": ["Return"]}])
    rec.write("model_response", response_id="resp_0002_e2036", http_status=200,
              text="done: booked the pickup and saved its confirmation number to ~/Documents/pickup.txt")
    rec.write("check", kind="sqlite", target="/home/sandbox/.local/share/pickup/pickup.db",
              rule="rows of: SELECT name, date, time_window, items FROM pickups ORDER BY id",
              expected=[["Ada Lovelace", "2030-05-17", "12:00-15:00", "2 boxes of books"]],
              observed=[["Ada Lovelace", "2030-05-17", "12:00-15:00", "2 boxes of books"]], passed=True)
    rec.write("check", kind="file", target="/home/sandbox/Documents/pickup.txt", rule="regex",
              expected="\\A\\s*PU-[0-9]{6}\\s*\\Z", observed="PU-298551\n", passed=True)
    rec.write("check", kind="sqlite", target="/home/sandbox/.local/share/pickup/pickup.db", rule=PICKUP_SQL,
              expected=[[1]], observed=[[0]], passed=False)
    rec.write("network_log", complete=True, decisions=1)
    rec.finish("failed", "2 of 3 checks", final_message="done",
               timings={"sandbox_start": 4.1, "launch_ready": 2.5, "loop": 1.8, "verify": 0.04, "teardown": 0.9},
               wall_s=9.5)


def long_names(rec: RunRecord) -> None:
    """A long task name, a long failure reason, a failed check with long values, a browser call with a
    long URL and error, an origin request, an unmet screen expectation."""
    _started(rec, LONG_NAME)
    _step(rec, 0, [{"type": "keypress", "keys": ["ctrl", "alt", "shift", "super", "F12"] * 4}], text=LONG_REASON)
    rec.write("browser_call", step=2, call_id="call_0002", member="navigate", arguments={"url": LONG_URL},
              ok=False, error="navigation refused: " + LONG_URL)
    rec.write("approval", what="origin_access", decision="denied", by="console", origin=LONG_URL[:60],
              request_id="oreq_1", latency_ms=1500.0)
    rec.write("expectation", turn=3, call_id="call_0003", met=False, reason="deadline of 30s passed",
              unmet=[{"kind": "color", "expected": "color #ffffff in >=90% of 360x26 at (460,180) " * 4,
                      "observed": "0.0% within 8 of #ffffff (most common #23395d) " * 4}])
    rec.write("check", kind="file", target="/home/sandbox/Documents/" + "a-very-long-folder-name/" * 6 + "out.txt",
              rule="text", expected="PU-123456 " * 30, observed="something else entirely " * 30, passed=False)
    rec.finish("error", LONG_REASON, timings={"sandbox_start": 104.1, "launch_ready": 62.5, "loop": 1801.8,
                                              "verify": 10.04, "teardown": 30.9}, wall_s=2009.5)


def hostile(rec: RunRecord) -> None:
    """Terminal escapes, bidi controls, markup and emoji codes from the model, the guest and the gateway."""
    _started(rec, EVIL)
    rec.write("network", seq=1, origin=EVIL, decision="deny", reason=EVIL)
    rec.write("model_response", response_id=None, http_status=500, error={"code": "x", "message": EVIL * 3})
    rec.write("computer_call", call_id="c" + EVIL, form="actions", actions=[{"type": "keypress", "keys": [EVIL]}],
              pending_checks=[{"id": "sc", "code": EVIL, "message": EVIL}])
    rec.write("action", call_id="c", action="keypress", duration_ms=1.0, error=EVIL * 3)
    rec.write("check", kind="file", target="/x" + EVIL, rule="text", expected="a", observed=EVIL * 3, passed=False)
    rec.finish("failed", EVIL * 3)


SHAPES: dict[str, Callable[[RunRecord], None]] = {"pickup": pickup, "long-names": long_names, "hostile": hostile}


def _written(tmp_path: Path, shape: str, console: Console) -> RunRecord:
    rec = RunRecord(tmp_path, "r")
    follow_entries(rec.bus, RunPrinter(console), name="terminal")
    SHAPES[shape](rec)
    rec.close()
    return rec


def _fits(text: str) -> list[str]:
    lines = text.splitlines()
    assert lines, "nothing printed"
    wide = [(cell_len(line), line) for line in lines if cell_len(line) > WIDTH]
    assert not wide, wide
    return lines


def _table_rows(text: str) -> int:
    """Lines of a printed summary table that hold a row (between its top and bottom borders)."""
    return sum(1 for line in text.splitlines() if line.startswith("│"))


@pytest.mark.parametrize("shape", SHAPES)
def test_progress_lines_are_one_line_an_entry_within_100_columns(tmp_path, shape):
    """On a console of 100 columns with rich's defaults (it wraps what is too long) and on the CLI's
    piped console (200 columns, it never wraps) alike, every line fits, and there are as many lines as
    on a console wide enough for all of them to be whole."""
    wrapping = io.StringIO()
    _written(tmp_path / "a", shape, Console(file=wrapping, width=WIDTH, force_terminal=False, emoji=False))
    piped = io.StringIO()
    _written(tmp_path / "b", shape, Console(file=piped, width=200, force_terminal=False, soft_wrap=True, emoji=False))
    whole = io.StringIO()
    _written(tmp_path / "c", shape, Console(file=whole, width=5000, force_terminal=False, soft_wrap=True, emoji=False))
    lines = _fits(wrapping.getvalue())
    assert len(lines) == len(whole.getvalue().splitlines()), wrapping.getvalue()
    assert _fits(piped.getvalue()) == lines
    if shape == "hostile":
        assert_shown_safely(wrapping.getvalue())


def test_a_check_line_shortens_its_sql_and_keeps_what_was_observed(tmp_path):
    out = io.StringIO()
    _written(tmp_path, "pickup", Console(file=out, width=WIDTH, force_terminal=False))
    (sql_check,) = [line for line in out.getvalue().splitlines() if line.startswith("check FAIL sqlite ")]
    assert "…" in sql_check and PICKUP_SQL not in sql_check
    assert sql_check.endswith(": expected [[1]], observed [[0]]"), sql_check


@pytest.mark.parametrize("shape", SHAPES)
def test_the_summary_table_has_one_line_a_row_within_100_columns(tmp_path, shape):
    rec = _written(tmp_path, shape, Console(file=io.StringIO()))
    entries = read_entries(rec.path)
    rows = summary_table(entries, "runs/r/record.jsonl").row_count
    for console in (Console(file=io.StringIO(), width=WIDTH, force_terminal=False, record=True),
                    Console(file=io.StringIO(), width=200, force_terminal=False, soft_wrap=True, record=True)):
        print_summary(entries, "runs/r/record.jsonl", console=console)
        text = console.export_text()
        lines = _fits(text)
        assert not lines[0].startswith("┌") and lines[1].startswith("┌"), text  # the title: one line
        assert _table_rows(text) == rows, text
        if shape == "hostile":
            assert_shown_safely(text)
    if shape == "pickup":
        assert "…" in text and PICKUP_SQL not in text
        assert "sandbox_start 4.1s, launch_ready 2.5s, loop 1.8s, verify 0.0s, teardown 0.9s" in text


def test_report_prints_within_100_columns_and_keeps_values_whole_in_json_and_html(tmp_path, monkeypatch, capsys):
    from controller.commands.report import report

    _written(tmp_path, "pickup", Console(file=io.StringIO()))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)
    for as_json in (False, True):
        with pytest.raises(typer.Exit):
            report(Path("r"), as_json=as_json, as_html=False)
        if not as_json:
            text = capsys.readouterr().out
            assert make_console().width > WIDTH  # a pipe: wider than the table may be
            _fits(text)
            assert _table_rows(text) == summary_table(read_entries(Path("r"))).row_count + 1  # and the record's
            assert PICKUP_SQL not in text
    summary = json.loads(capsys.readouterr().out)
    assert [c["rule"] for c in summary["checks"]][2] == PICKUP_SQL
    assert str(escape(PICKUP_SQL)) in render_report(tmp_path / "r")
