"""Run-record entry models: each type validates its fields, the record format is checked, the JSON on
disk keeps its shape, ``ts`` never decreases, and the gateway's decision log is copied into the record
once per line, in order, whatever the log holds."""

from __future__ import annotations

import json
import threading

import pytest

from controller.run import entries as en
from controller.run.record import RunRecord, read_entries, summarize
from controller.run.recording import DecisionTail, network_entry


def test_every_type_has_a_model_and_the_record_types_are_the_contract():
    assert set(en.ENTRY_TYPES) == {"run_started", "model_response", "computer_call", "approval", "action",
                                   "screenshot", "network", "network_log", "check", "expectation", "run_finished",
                                   "human_action", "takeover", "agents_event", "view_dropped", "sign_in", "browser_call", "policy",
                                   "video", "web_recording", "redaction"}
    started = en.as_entry({"type": "run_started", "task": {"name": "t"}})
    assert isinstance(started, en.RunStarted) and started.format == en.FORMAT == 9
    assert list(started.as_json())[:3] == ["ts", "type", "format"]


@pytest.mark.parametrize("data, needle", [
    ({"type": "chatter"}, "unknown entry type 'chatter'"),
    ({"task": {"name": "t"}}, "without a type"),
    ([1, 2], "JSON object"),
    ({"type": "run_started", "task": "x"}, "run_started entry: task"),
    ({"type": "run_started", "task": {"name": "t"}, "format": "1"}, "format"),
    ({"type": "model_response", "usage": {"total_tokens": "many"}}, "usage.total_tokens"),
    ({"type": "model_response", "usage": {"total_tokens": float("inf")}}, "usage.total_tokens"),
    ({"type": "run_finished", "status": "maybe"}, "status"),
    ({"type": "run_finished", "status": "passed", "wall_s": float("inf")}, "wall_s"),
    ({"type": "network", "origin": "http://x", "decision": "perhaps"}, "decision"),
    ({"type": "action", "action": "click", "colour": "red"}, "colour"),
    ({"type": "check", "passed": True, "ts": "yesterday"}, "ts"),
    ({"type": "check", "passed": True, "ts": "2030-01-01T00:00:00"}, "time zone"),
])
def test_entries_that_do_not_fit_their_model_are_refused_naming_the_field(data, needle):
    with pytest.raises(en.EntryError) as caught:
        en.as_entry(data)
    assert needle in str(caught.value)


def test_the_json_on_disk_keeps_its_shape_and_ts_never_decreases(tmp_path, monkeypatch):
    import datetime as dt

    import controller.run.record as record_module

    times = iter([dt.datetime(2030, 1, 1, 0, 0, 5, tzinfo=dt.timezone.utc),
                  dt.datetime(2030, 1, 1, 0, 0, 3, tzinfo=dt.timezone.utc),  # the wall clock stepped back
                  dt.datetime(2030, 1, 1, 0, 0, 6, tzinfo=dt.timezone.utc)])

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206
            return next(times)

    monkeypatch.setattr(record_module._dt, "datetime", Clock)
    rec = RunRecord(tmp_path, "r")
    rec.write(en.RunStarted(task=en.TaskRef(name="t"), mode="offline"))
    rec.write(en.Action(call_id="c", action="click", duration_ms=1.5, error=None))
    rec.finish("passed", "ok")
    rec.close()
    lines = (rec.path).read_text().splitlines()
    assert lines[1] == ('{"ts": "2030-01-01T00:00:05.000+00:00", "type": "action", "call_id": "c", '
                        '"action": "click", "duration_ms": 1.5, "error": null}')
    assert [e.ts[17:23] for e in read_entries(rec.path)] == ["05.000", "05.000", "06.000"]
    assert json.loads(lines[0])["format"] == en.FORMAT


def test_a_format_1_record_still_reads(tmp_path):
    path = tmp_path / "record.jsonl"
    path.write_text(
        '{"ts": "2030-01-01T00:00:00.000+00:00", "type": "run_started", "task": {"name": "t"}}\n'
        '{"ts": "2030-01-01T00:00:01.000+00:00", "type": "approval", "what": "safety_check", '
        '"decision": "denied", "by": "terminal", "call_id": "c"}\n'
        '{"ts": "2030-01-01T00:00:02.000+00:00", "type": "run_finished", "status": "failed"}\n')
    entries = read_entries(path)
    assert [e.type for e in entries] == ["run_started", "approval", "run_finished"]
    assert entries[1].request_id is None and entries[1].decision == "denied"


def test_approval_format_2_fields_and_human_entries():
    a = en.as_entry({"type": "approval", "what": "action", "decision": "withdrawn", "by": "cancel",
                     "request_id": "req_x", "latency_ms": 12.5, "screenshot": "shot-0001.png"})
    assert a.decision == "withdrawn" and a.latency_ms == 12.5
    with pytest.raises(en.EntryError, match="latency_ms"):
        en.as_entry({"type": "approval", "what": "action", "decision": "denied", "by": "x", "latency_ms": -1})
    with pytest.raises(en.EntryError, match="control"):
        en.as_entry({"type": "takeover", "control": "robot"})
    assert en.as_entry({"type": "human_action", "action": "type <3 chars>"}).by == "console"


def test_writes_from_threads_are_whole_lines_in_ts_order(tmp_path):
    rec = RunRecord(tmp_path, "r")

    def writer(n: int) -> None:
        for i in range(200):
            rec.write(en.Action(call_id=f"c{n}", action="move", duration_ms=float(i)))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.close()
    stamps = [e.ts for e in read_entries(rec.path)]
    assert len(stamps) == 800 and stamps == sorted(stamps)


def _decision(n: int, **update) -> dict:
    return {"ts": f"2030-01-01T00:00:{n:02d}.000+00:00", "origin": f"http://h{n}.test", "decision": "deny",
            "reason": "not-allowlisted", "client": "10.0.0.2:5000", "via": "request", **update}


def _reader(log: list):
    """A gateway log read the way ``Sandbox.decisions_since`` reads it: lines ``start``.. at most ``n``."""
    return lambda start, n: list(log[start:start + n])


def test_the_tail_records_each_log_line_once_in_order_and_reconciles_at_teardown(tmp_path):
    log: list = []
    rec = RunRecord(tmp_path, "r")
    tail = DecisionTail(rec, _reader(log))
    assert tail.poll() == 0
    log += [_decision(1), _decision(2)]
    assert tail.poll() == 2 and tail.poll() == 0  # nothing twice
    rec.write(en.Action(action="click"))
    log += [_decision(3, decision="allow", reason="allowlisted", address="10.0.0.9", via="connect")]
    netlog = tail.finish()  # what arrived after the last read is not lost
    rec.close()
    assert netlog.complete and netlog.decisions == 3
    entries = read_entries(rec.path)
    assert [(e.type, getattr(e, "seq", None)) for e in entries] == [
        ("network", 1), ("network", 2), ("action", None), ("network", 3), ("network_log", None)]
    assert [(e.origin, e.decision, e.at) for e in entries if isinstance(e, en.Network)] == [
        (d["origin"], d["decision"], d["ts"]) for d in log]
    s = summarize(entries)
    assert (s["network_allowed"], s["network_denied"], s["network_log_complete"]) == (1, 2, True)


def test_what_is_read_while_an_action_is_in_flight_follows_the_action_line(tmp_path):
    log: list = []
    rec = RunRecord(tmp_path, "r")
    tail = DecisionTail(rec, _reader(log))
    log.append(_decision(1))
    tail.hold()  # the driver sends an action
    log.append(_decision(2))  # made during it; read before its line is written
    assert tail.poll() == 2
    rec.write(en.Action(action="click"))
    tail.release()  # the action's line is written
    tail.hold()  # the next action: cut short by the run's end, it writes no line
    log.append(_decision(3))
    assert tail.poll() == 1
    netlog = tail.finish()
    rec.close()
    assert netlog.complete and netlog.decisions == 3
    assert [(e.type, getattr(e, "seq", None)) for e in read_entries(rec.path)] == [
        ("action", None), ("network", 1), ("network", 2), ("network", 3), ("network_log", None)]


def test_the_tail_caps_each_read_and_escapes_and_cuts_gateway_text(tmp_path, monkeypatch):
    import controller.run.recording as recording

    monkeypatch.setattr(recording, "MAX_DECISIONS_PER_READ", 3)
    log = [_decision(i % 60) for i in range(7)]
    log.append(_decision(7, origin="http://\x1b[2J" + "a" * 100000, future_field="ignored"))
    rec = RunRecord(tmp_path, "r")
    tail = DecisionTail(rec, _reader(log))
    assert [tail.poll(), tail.poll(), tail.poll(), tail.poll()] == [3, 3, 2, 0]
    tail.finish()
    rec.close()
    network = [e for e in read_entries(rec.path) if isinstance(e, en.Network)]
    assert [e.seq for e in network] == list(range(1, 9))
    assert "\x1b" not in network[-1].origin and network[-1].origin.startswith("http://\\x1b[2J")
    assert len(network[-1].origin) <= recording.FIELD_CHARS["origin"]


@pytest.mark.parametrize("log, error", [
    ([_decision(1), "not an object", {"origin": "x"}], "2 lines are not decisions (line 2: not a JSON object)"),
    ([_decision(1), {**_decision(2), "decision": "maybe"}], "line 2: decision"),
])
def test_lines_that_are_not_decisions_make_the_log_incomplete_not_silent(tmp_path, log, error):
    rec = RunRecord(tmp_path, "r")
    netlog = DecisionTail(rec, _reader(log)).finish()
    rec.close()
    assert not netlog.complete and netlog.decisions == len(log) and error in netlog.error
    assert [e.seq for e in read_entries(rec.path) if e.type == "network"] == [1]


def test_a_log_that_cannot_be_read_is_reported(tmp_path):
    rec = RunRecord(tmp_path, "r")

    def broken(start: int, max_lines: int) -> list:
        raise RuntimeError("gateway gone \x1b[2J")

    other = DecisionTail(rec, broken)
    assert other.poll() == 0  # the run goes on
    netlog = other.finish()
    rec.close()
    assert not netlog.complete and "gateway gone \\x1b[2J" in netlog.error


def test_the_background_reader_records_decisions_without_the_caller_waiting(tmp_path):
    import threading
    import time

    log: list = []
    release = threading.Event()
    reads: list[int] = []

    def slow_gateway(start: int, max_lines: int) -> list:
        reads.append(start)
        release.wait(10)  # a gateway that takes its time to answer
        return log[start:start + max_lines]

    rec = RunRecord(tmp_path, "r")
    tail = DecisionTail(rec, slow_gateway).start()
    log += [_decision(1), _decision(2)]
    t = time.monotonic()
    for _ in range(5):
        tail.poke()  # returns at once: the read happens on the reader's thread
    assert time.monotonic() - t < 1.0
    release.set()
    deadline = time.monotonic() + 10
    while tail.consumed < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # poll interval while waiting for the reader thread's writes
    assert tail.consumed == 2
    log.append(_decision(3))
    netlog = tail.finish()
    rec.close()
    assert netlog.complete and netlog.decisions == 3
    assert len(reads) <= 5  # pokes during a read were coalesced into one more read
    assert [e.seq for e in read_entries(rec.path) if e.type == "network"] == [1, 2, 3]


def test_network_entry_keeps_the_gateway_fields():
    entry = network_entry(_decision(4), seq=9)
    assert isinstance(entry, en.Network)
    assert (entry.seq, entry.origin, entry.decision, entry.reason, entry.via, entry.at) == (
        9, "http://h4.test", "deny", "not-allowlisted", "request", "2030-01-01T00:00:04.000+00:00")
    assert network_entry(["x"], seq=1) == "line 1: not a JSON object"


def test_the_architecture_doc_carries_the_record_reference_rendered_from_the_models():
    import re
    from pathlib import Path

    from controller.run import entries

    doc = (Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"<!-- record-reference:start -->\n(.*?)<!-- record-reference:end -->", doc, re.S)
    assert block, "docs/ARCHITECTURE.md lost its record-reference block"
    assert block.group(1) == entries.reference_markdown(), "run: python -m controller.run.entries, paste into the doc"
    for kind, cls in entries.ENTRY_TYPES.items():
        assert f"| `{kind}` |" in block.group(1)
        for name in cls.model_fields:
            assert name in ("ts", "type") or f"`{name}`" in block.group(1)


def test_decision_lines_keep_line_numbers_and_leave_a_partial_line():
    from controller.sandbox import parse_decision_lines

    data = b'{"a": 1}\nnot json \x1b\n\n{"b": 2}\n{"c": 3'
    assert parse_decision_lines(data) == [{"a": 1}, "not json \x1b", "", {"b": 2}]
    assert parse_decision_lines(b'{"c": 3') == [] and parse_decision_lines(b"") == []


def test_model_words_reach_the_record_escaped_and_capped():
    from controller.run.recording import model_text

    body = {"output": [
        {"type": "reasoning", "summary": []},
        {"type": "message", "content": [{"type": "output_text", "text": "done:\x1b[2J saved"},
                                        {"type": "refusal", "refusal": "no"}]},
        {"type": "computer_call", "call_id": "c"},
        {"type": "message", "content": [{"type": "output_text", "text": "second\nline"}]},
    ]}
    said = model_text(body)
    assert said == "done:\\x1b[2J saved\n\nsecond\nline"
    assert model_text({"output": [{"type": "computer_call"}]}) is None and model_text(None) is None
    long = model_text({"output": [{"type": "message", "content": [{"type": "output_text", "text": "x" * 10**5}]}]})
    assert len(long) <= en.MAX_MODEL_TEXT
    assert en.as_entry({"type": "model_response", "text": said}).text == said
