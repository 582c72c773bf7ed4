"""The run record: contract types, screenshots beside it, typed text redacted, summary numbers."""

from __future__ import annotations

import hashlib
import json

import pytest
from rich.console import Console

from controller.run.mapping import Frame
from controller.run.record import RunRecord, read_entries, redact_action, summarize, summary_table
from controller.run.entries import FORMAT


def test_entries_have_ts_and_contract_types(tmp_path):
    rec = RunRecord(tmp_path, "r1")
    rec.write("run_started", task={"name": "t"}, mode="offline")
    with pytest.raises(ValueError):
        rec.write("chatter", x=1)
    rec.finish("passed", "ok")
    rec.finish("failed", "second finish is ignored")
    with pytest.raises(ValueError):
        RunRecord(tmp_path, "r2").finish("maybe")
    rec.close()
    entries = read_entries(tmp_path / "r1")
    assert [e.type for e in entries] == ["run_started", "run_finished"]
    assert all(e.ts for e in entries) and entries[-1].status == "passed"


def test_screenshot_saved_beside_the_record_with_its_hash(tmp_path):
    rec = RunRecord(tmp_path, "r")
    data = b"\x89PNG\r\n\x1a\n-not-really"
    entry = rec.save_screenshot(data, "image/png", image_size=(640, 400), frame=Frame(0, 0, 1280, 800))
    rec.close()
    assert (rec.dir / entry.file).read_bytes() == data
    assert entry.sha256 == hashlib.sha256(data).hexdigest()
    [line] = read_entries(rec.dir)
    assert line.image_size == (640, 400) and line.frame == (0, 0, 1280, 800)


def test_typed_text_is_redacted():
    assert redact_action({"type": "type", "text": "hunter2"}) == {"type": "type", "text_length": 7}
    assert redact_action({"type": "click", "x": 1}) == {"type": "click", "x": 1}


def test_summary_counts_and_incomplete_usage(tmp_path):
    rec = RunRecord(tmp_path, "r")
    rec.write("run_started", task={"name": "t"}, mode="offline")
    rec.write("model_response", response_id="a", http_status=200, usage={"input_tokens": 5, "output_tokens": 2,
                                                                        "total_tokens": 7})
    rec.write("model_response", response_id="b", http_status=200, usage=None)
    rec.write("action", call_id="c", action="click", duration_ms=1.0, error=None)
    rec.write("action", call_id="c", action="type", duration_ms=1.0, error="boom")
    rec.write("action", call_id="c", action="screenshot", duration_ms=1.0, error=None)
    rec.write("approval", what="safety_check", decision="denied", by="no-approver")
    rec.write("network", origin="https://x.example", decision="deny", reason="not-allowlisted")
    rec.write("check", kind="file", target="/x", rule="text", expected="a", observed="b", passed=False)
    rec.finish("failed", "1 of 1 checks failed", timings={"loop": 1.0})
    rec.close()
    entries = read_entries(rec.path)
    s = summarize(entries)
    assert (s["steps"], s["actions"], s["actions_failed"]) == (2, 2, 1)
    assert s["usage"] == {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7, "complete": False, "missing": 1}
    assert (s["approvals_denied"], s["network_denied"], s["checks_passed"], s["checks_total"]) == (1, 1, 0, 1)
    console = Console(record=True, width=160)
    console.print(summary_table(entries, rec.path))
    text = console.export_text()
    assert "incomplete" in text and "FAIL" in text and "failed" in text
    json.dumps(s)


def test_summary_shows_guest_and_model_text_literally(tmp_path):
    """Observed file contents (written in the guest), reasons and task names are not console markup."""
    entries = [
        {"type": "run_started", "ts": "2030-01-01T00:00:00+00:00", "task": {"name": "[bold]t"}, "mode": "offline"},
        {"type": "check", "ts": "2030-01-01T00:00:01+00:00", "kind": "file", "target": "/home/[/]", "rule": "text",
         "expected": "[red]a", "observed": "[/] [link=https://evil.test]x[/link]", "passed": False},
        {"type": "run_finished", "ts": "2030-01-01T00:00:02+00:00", "status": "failed", "reason": "[/bold]"},
    ]
    console = Console(record=True, width=300)
    console.print(summary_table(entries, tmp_path / "[/]"))
    text = console.export_text()
    for literal in ("[bold]t", "/home/[/]", "'[/] [link=https://evil.test]x[/link]'", "[/bold]", "'[red]a'"):
        assert literal in text, literal


@pytest.mark.parametrize("content", ['[1, 2]\n', '"text"\n', '{"type": "run_started", "task": null}\n'])
def test_records_that_are_not_entries_are_refused_or_summarised(tmp_path, content):
    path = tmp_path / "record.jsonl"
    path.write_text(content)
    try:
        entries = read_entries(path)
    except ValueError as exc:
        assert "record.jsonl:1" in str(exc)
        return
    summary = summarize(entries)
    assert summary["status"] == "unfinished"
    Console(record=True).print(summary_table(entries))


def _report(run, *args: str):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(PYTHONPATH=str(root), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "controller.cli", "report", *args, str(run)], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


GOOD_LINES = [
    '{"ts": "2030-01-01T00:00:00.000+00:00", "type": "run_started", "format": 1, "task": {"name": "t"}}',
    '{"ts": "2030-01-01T00:00:01.000+00:00", "type": "action", "action": "click", "error": null}',
    '{"ts": "2030-01-01T00:00:02.000+00:00", "type": "run_finished", "status": "passed", "reason": "ok"}',
]


@pytest.mark.parametrize("change, needles", [
    ((0, GOOD_LINES[0].replace('"format": 1', f'"format": {FORMAT + 1}')),
     ["record.jsonl:1:", f"format {FORMAT + 1} is newer", f"format {FORMAT}"]),
    ((2, GOOD_LINES[2].replace('"type": "run_finished"', '"type": "run_finished", "extra_field": 1')),
     ["record.jsonl:3:", "run_finished entry", "extra_field"]),
    ((1, '{"ts": "2030-01-01T00:00:01.000+00:00", "type": "action", "duration_ms": "slow"}'),
     ["record.jsonl:2:", "action entry", "duration_ms"]),
    ((1, '{"ts": "2030-01-01T00:00:01.000+00:00", "type": "teleport"}'),
     ["record.jsonl:2:", "unknown entry type 'teleport'"]),
    ((1, '{"type": "action", "action": "click"}'), ["record.jsonl:2:", "action entry without ts"]),
    ((2, '{"ts": "2030-01-01T00:00:02.000+00:00", "type": "run_finished", "status": "passed", "reason": "\x1b[2J'),
     ["record.jsonl:3:", "not JSON"]),
    # an entry type that is not a string, duplicate keys (which one would another tool take?), numbers
    # JSON cannot carry (shown as inf, written back as null), integers past Python's conversion limit
    ((1, '{"ts": "2030-01-01T00:00:01.000+00:00", "type": ["action"]}'),
     ["record.jsonl:2:", "unknown entry type"]),
    ((1, '{"ts": "2030-01-01T00:00:01.000+00:00", "type": {"a": 1}}'), ["record.jsonl:2:", "unknown entry type"]),
    ((2, GOOD_LINES[2].replace('"status": "passed"', '"status": "failed", "status": "passed"')),
     ["record.jsonl:3:", "duplicate key 'status'"]),
    ((1, '{"ts": "2030-01-01T00:00:01.000+00:00", "type": "action", "duration_ms": 1e309}'),
     ["record.jsonl:2:", "out of range"]),
    ((1, '{"ts": "2030-01-01T00:00:01.000+00:00", "type": "action", "duration_ms": NaN}'),
     ["record.jsonl:2:", "NaN is not JSON"]),
    ((1, '{"ts": "2030-01-01T00:00:01.000+00:00", "type": "action", "duration_ms": 1' + "0" * 5000 + '}'),
     ["record.jsonl:2:", "not JSON"]),
])
def test_report_refuses_malformed_and_newer_records_naming_file_and_line(tmp_path, change, needles):
    lines = list(GOOD_LINES)
    lines[change[0]] = change[1]
    run = tmp_path / "run"
    run.mkdir()
    (run / "record.jsonl").write_text("\n".join(lines) + "\n")
    for args in ((), ("--json",)):
        out = _report(run, *args)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
        [line] = out.stderr.strip().splitlines()
        assert "\x1b" not in line and out.stdout == ""
        for needle in needles:
            assert needle in line, (needle, line)


def test_report_reads_a_good_record_and_one_from_before_the_format_field(tmp_path):
    for name, first in (("now", GOOD_LINES[0]), ("before", GOOD_LINES[0].replace('"format": 1, ', ""))):
        run = tmp_path / name
        run.mkdir()
        (run / "record.jsonl").write_text("\n".join([first, *GOOD_LINES[1:]]) + "\n")
        out = _report(run, "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["actions"] == 1


def test_summary_shows_hostile_text_escaped_and_never_as_emoji_on_any_console(tmp_path):
    """A check's observed file, the run's reason and the task name may hold terminal escapes, bidi
    controls and ``:emoji:`` codes: the table shows them as text even on a console with rich's defaults."""
    import io

    from tests.controller.hostile_text import EVIL, SHOWN, assert_shown_safely

    entries = [
        {"type": "run_started", "ts": "2030-01-01T00:00:00+00:00", "task": {"name": EVIL}, "mode": "offline"},
        {"type": "check", "ts": "2030-01-01T00:00:01+00:00", "kind": "file", "target": "/x" + EVIL, "rule": "text",
         "expected": "a", "observed": EVIL, "passed": False},
        {"type": "run_finished", "ts": "2030-01-01T00:00:02+00:00", "status": "failed", "reason": EVIL},
    ]
    out = io.StringIO()
    Console(file=out, width=3000, force_terminal=False).print(summary_table(entries, tmp_path))
    assert_shown_safely(out.getvalue())
    assert out.getvalue().count(SHOWN) == 4  # task name, target, observed, reason


def test_unicode_line_breaks_in_hostile_text_keep_one_entry_a_line(tmp_path):
    """A model message or a guest value may hold U+2028, U+2029 or U+0085, which str.splitlines (and
    many tools) read as line ends: the record escapes them, and reads a line holding one whole."""
    rec = RunRecord(tmp_path, "r")
    rec.write("run_started", task={"name": "t"}, mode="offline")
    rec.finish("failed", "model said: a\u2028b\u2029c\x85d")
    rec.close()
    assert len(rec.path.read_text(encoding="utf-8").splitlines()) == 2
    assert read_entries(rec.path)[-1].reason == "model said: a\u2028b\u2029c\x85d"
    raw = tmp_path / "raw.jsonl"
    raw.write_text('{"type": "run_finished", "ts": "2030-01-01T00:00:00+00:00", "status": "failed", '
                   '"reason": "a\u2028b"}\n', encoding="utf-8")
    assert read_entries(raw)[0].reason == "a\u2028b"


def test_report_refuses_a_fifo_without_blocking(tmp_path):
    import os

    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "record.jsonl")
    out = _report(run)
    assert out.returncode == 2 and "not a regular file" in out.stderr, out.stderr


def test_a_lone_surrogate_from_the_model_is_recorded_as_its_json_escape(tmp_path):
    from controller.run.record import read_entries

    rec = RunRecord(tmp_path, "r")
    rec.write("run_finished", status="passed", final_message="a\ud800b")
    rec.close()
    raw = rec.path.read_bytes()
    assert b"\\ud800" in raw
    assert read_entries(rec.path)[-1].final_message == "a\ud800b"


def test_typed_text_is_kept_only_when_the_run_records_it():
    from controller.run.record import recorded_action
    from controller.run.runner import _human_recorded

    typed = {"type": "type", "text": "hunter2"}
    assert recorded_action(typed, False) == {"type": "type", "text_length": 7}
    assert recorded_action(typed, True) == {"type": "type", "text_length": 7, "text": "hunter2"}
    assert recorded_action({"type": "click", "x": 1, "y": 2, "button": "left"}, False)["x"] == 1
    person = {"action": "type <7 chars>", "input": typed, "by": "console"}
    assert _human_recorded(person, False)["input"] == {"type": "type", "text_length": 7}
    assert "hunter2" in str(_human_recorded(person, True))


def test_a_record_of_many_tiny_lines_costs_a_reader_little_more_than_its_bytes(tmp_path):
    """A record of a million lines that are no entries (``0``) is refused at its first line, holding
    little more than its text; one of more entries than a run writes is refused at the first too many."""
    import tracemalloc

    from controller.run import record as record_module

    run = tmp_path / "flood"
    run.mkdir()
    (run / "record.jsonl").write_text("0\n" * 1_000_000 + "{not json\n")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"record.jsonl:1: an entry must be a JSON object, not int"):
            read_entries(run)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2_000_000, f"{peak} bytes held to read a 2 MB record"
    line = '{"type": "action", "ts": "2030-01-01T00:00:00+00:00"}\n'
    (run / "record.jsonl").write_text(line * (record_module.MAX_RECORD_ENTRIES + 1))
    with pytest.raises(ValueError, match=rf"record.jsonl:{record_module.MAX_RECORD_ENTRIES + 1}: more than "
                                         rf"{record_module.MAX_RECORD_ENTRIES} entries"):
        read_entries(run)
