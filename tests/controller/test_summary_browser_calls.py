"""The summary counts the calls of the browser tools (contract 9): ``summarize``'s ``browser_calls`` and
``browser_calls_failed`` from a record written and read back (a real :class:`RunRecord`), the summary
table's row (only for a run that made any), and the HTML report's header count, which takes the
summary's."""

from __future__ import annotations

from controller.report.steps import build_view
from controller.run.entries import BrowserCall, BrowserResult, ModelResponse
from controller.run.record import RunRecord, read_entries, summarize, summary_table


def _rows(entries) -> dict[str, str]:
    """The summary table's rows as ``{what: value}`` (plain text)."""
    table = summary_table(entries)
    whats, values = (list(column.cells) for column in table.columns)
    return {str(w): str(v) for w, v in zip(whats, values)}


def _record(tmp_path, calls: list[BrowserCall]):
    record = RunRecord(tmp_path, "browser-summary")
    record.write("run_started", task={"name": "browser"}, mode="offline")
    record.write(ModelResponse(response_id="resp_1", http_status=200))
    for call in calls:
        record.write(call)
    record.finish("passed", "1 of 1 checks")
    record.close()
    return read_entries(record.path)


def test_browser_calls_are_counted_and_shown(tmp_path):
    entries = _record(tmp_path, [
        BrowserCall(step=1, call_id="c1", member="read_page", ok=True, result=BrowserResult(kind="read", elements=3)),
        BrowserCall(step=1, call_id="c2", member="click", ok=False, error="stale_ref: the element is gone"),
        BrowserCall(step=1, call_id="c3", member="navigate", ok=False, error="navigation refused: policy"),
        BrowserCall(step=1, call_id="c4", member="type", ok=True, arguments={"target": "d1e2", "text_length": 3}),
    ])
    s = summarize(entries)
    assert (s["browser_calls"], s["browser_calls_failed"]) == (4, 2)
    assert s["actions"] == 0 and s["computer_calls"] == 0  # browser calls are not input actions
    assert _rows(entries)["browser calls"] == "4 calls of the browser tools (2 failed)"
    header = dict(build_view(entries, "browser-summary")["header"]["counts"])
    assert header["browser calls"] == 4


def test_a_run_without_browser_calls_has_no_browser_row(tmp_path):
    entries = _record(tmp_path, [])
    s = summarize(entries)
    assert (s["browser_calls"], s["browser_calls_failed"]) == (0, 0)
    assert "browser calls" not in _rows(entries)
    assert dict(build_view(entries, "browser-summary")["header"]["counts"])["browser calls"] == 0
