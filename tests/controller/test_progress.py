"""Console output: the run record's listener prints one line per entry (typed text only as a length,
network decisions deduplicated, control characters escaped), piped consoles are wide enough that
tables do not split words, the summary counts approval decisions apart from opt-ins, and ``up``
shows the policy in TOML form with the token file and an example curl line."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from rich.console import Console

from controller.run.bus import follow_entries
from controller.audit import AuditReport, ProbeResult, render_table
from controller.commands.up import guest_description, policy_toml, sandbox_table
from controller.gateway.policy import NetworkPolicy
from controller.run.progress import PIPE_WIDTH, RunPrinter, make_console, summarize_action
from controller.run.record import RunRecord, read_entries, summarize, summary_table


def _printed(tmp_path: Path, write) -> list[str]:  # noqa: ANN001
    console = Console(record=True, width=200, force_terminal=False)
    rec = RunRecord(tmp_path, "r")
    follow_entries(rec.bus, RunPrinter(console), name="terminal")
    write(rec)
    rec.close()
    return console.export_text().splitlines()


@pytest.mark.parametrize("action, line", [
    ({"type": "click", "x": 640, "y": 250, "button": "left"}, "click (640,250) left"),
    ({"type": "double_click", "x": 1, "y": 2}, "double_click (1,2)"),
    ({"type": "type", "text_length": 12}, "type <12 chars>"),
    ({"type": "type", "text": "hunter2-secret"}, "type <14 chars>"),
    ({"type": "keypress", "keys": ["ctrl", "c"]}, "keypress ctrl+c"),
    ({"type": "scroll", "x": 10, "y": 20, "scroll_x": 0, "scroll_y": -300}, "scroll (10,20) 0,-300"),
    ({"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 5, "y": 5}, {"x": 30, "y": 40}]}, "drag (1,2)->(30,40) 3 points"),
    ({"type": "wait"}, "wait"),
    ({"type": "screenshot"}, "screenshot"),
])
def test_actions_are_summarised_without_typed_text(action, line):
    assert summarize_action(action) == line


def test_each_entry_is_one_line_and_network_decisions_are_deduplicated(tmp_path):
    def write(rec: RunRecord) -> None:
        rec.write("run_started", task={"name": "t"}, mode="offline", sandbox="ds-1234", image="sha256:" + "a" * 64,
                  sandbox_start_s=4.25)
        rec.write("model_response", response_id="resp_67ccd2bed1ec8190b14f964abc0542670bb6", http_status=200,
                  usage={"input_tokens": 10, "output_tokens": 2, "total_tokens": 12})
        rec.write("computer_call", call_id="call_1", form="actions",
                  actions=[{"type": "type", "text_length": 5}, {"type": "keypress", "keys": ["Return"]}],
                  pending_checks=[])
        rec.write("action", call_id="call_1", action="type", duration_ms=3.0, error=None)
        rec.write("action", call_id="call_1", action="keypress", duration_ms=3.0, error="keysym refused")
        rec.write("approval", what="action", decision="denied", by="no-approver", action="type {'text_length': 5}")
        rec.write("model_response", response_id=None, http_status=429, error={"code": "rate_limit", "message": "slow"},
                  usage=None)
        for _ in range(3):
            rec.write("network", origin="http://evil.test:80", decision="deny", reason="not-allowlisted")
        rec.write("network", origin="https://ok.test:443", decision="allow", reason="allowlisted")
        rec.write("check", kind="file", target="/home/sandbox/x", rule="text", expected="a", observed="\x1b[31mred",
                  passed=False)
        rec.finish("failed", "1 of 1 checks failed")

    lines = _printed(tmp_path, write)
    assert lines[0] == "sandbox ds-1234 started in 4.2s (image sha256:aaaaaaaaaaaa)"
    assert lines[1] == "step 1 resp_67ccd2bed1… 12 tokens (in 10, out 2)"
    assert lines[2] == "  call call_1: type <5 chars>; keypress Return"
    assert lines[3] == "  action keypress failed: keysym refused"
    assert lines[4] == "  approval: action type {'text_length': 5} denied (no-approver)"
    assert lines[5] == "model request failed: HTTP 429 rate_limit slow"
    assert lines[6:8] == ["network deny http://evil.test:80 not-allowlisted (x3)",
                          "network allow https://ok.test:443 allowlisted"]
    # the guest's bytes cannot drive the terminal: ESC is escaped
    assert lines[8] == "check FAIL file /home/sandbox/x text: expected 'a', observed '\\x1b[31mred'"
    assert len(lines) == 9


def test_summary_counts_decisions_apart_from_opt_ins_and_explains_a_missing_file(tmp_path):
    rec = RunRecord(tmp_path, "r")
    rec.write("run_started", task={"name": "t"}, mode="offline")
    rec.write("approval", what="opt-in", decision="approved", by="command line", codes=["sensitive_action"])
    rec.write("approval", what="safety_check", decision="approved", by="opt-in", codes=["sensitive_action"])
    rec.write("action", call_id="c", action="click", duration_ms=1.0, error=None)
    rec.write("action", call_id="c", action="screenshot", duration_ms=1.0, error=None)
    for target, passed in (("/home/sandbox/a", True), ("/home/sandbox/b", True)):
        rec.write("check", kind="file", target=target, rule="text", expected="x", observed="x", passed=passed)
    rec.write("check", kind="file", target="/home/sandbox/gone", rule="text", expected="x", observed=None,
              passed=False, detail="file does not exist")
    rec.finish("failed", "1 of 3 checks failed")
    rec.close()
    entries = read_entries(rec.path)
    s = summarize(entries)
    assert (s["approvals_approved"], s["approvals_denied"], s["approvals_opt_in"]) == (1, 0, ["sensitive_action"])
    assert (s["actions"], s["screenshot_actions"]) == (1, 1)
    assert s["checks"][2] == {"kind": "file", "target": "/home/sandbox/gone", "rule": "text", "expected": "x",
                              "observed": None, "passed": False, "detail": "file does not exist"}
    console = Console(record=True, width=PIPE_WIDTH, force_terminal=False)
    console.print(summary_table(entries, rec.path))
    text = console.export_text()
    assert "1 approved, 0 denied; opt-in: --approve-safety-check sensitive_action" in text
    assert "1 input action (0 failed) and 1 screenshot action" in text and "│ 0 sent " in text
    assert "FAIL file /home/sandbox/gone text: expected 'x', file missing" in text
    assert "observed None" not in text
    assert "failed (1 of 3 checks failed)" in text
    assert str(rec.path) in text


def test_a_piped_console_is_wide_and_the_audit_table_keeps_names_whole(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    console = make_console()
    assert not console.is_terminal and console.width == PIPE_WIDTH
    probes = [ProbeResult(name=name, category=cat, target=target, expected="blocked", observed=observed, passed=True)
              for name, cat, target, observed in [
                  ("redirect-allowed-to-denied", "origins",
                   "http://allowed.audit.test:8080/redirect?to=http://denied.audit.test:8080/redirected", "status:403"),
                  ("targets-reached-only-via-gateway", "summary", "172.23.0.4", "0 hits from other peers"),
                  ("canary-not-resolved-by-gateway", "summary", "c3f9a1b2c4d5.canary.audit.test",
                   "3 decisions, 0 resolved"),
              ]]
    report = AuditReport(started="2030-01-01T00:00:00+00:00", sandbox="ds-1a2b3c4d",
                         policy={"mode": "deny-all"}, effective_policy={"mode": "deny-all"}, canary="c3f9")
    for width in (PIPE_WIDTH, 80):  # piped, and a narrow terminal: short words are never split
        console.width = width
        with console.capture() as capture:
            render_table(report.model_copy(update={"probes": probes}), console)
        text = capture.get()
        for p in probes:
            assert p.name in text, (width, text)
            assert p.category in text
        if width == PIPE_WIDTH:  # a table, each row on one line
            for p in probes:
                assert any(p.name in l and p.target in l and p.observed in l for l in text.splitlines()), text
        else:  # one line per probe
            assert "pass canary-not-resolved-by-gateway (summary)" in text, text


def test_an_emulated_guest_says_so_where_the_run_starts(tmp_path):
    def write(rec: RunRecord) -> None:
        rec.write("run_started", task={"name": "t"}, mode="offline", sandbox="dv-1234", image="vm:arm64:6372648eb852a8ad",
                  sandbox_start_s=50.1, time_scale=5.0)

    assert _printed(tmp_path, write)[0] == ("sandbox dv-1234 started in 50.1s (image vm:arm64:6372648eb8; "
                                            "under emulation: deadlines x5)")


def test_up_says_what_runs_the_guest():
    class Started:
        arch, accel, time_scale = "arm64", "tcg", 5.0

    assert guest_description(Started()) == "arm64, accel tcg, under emulation: deadlines x5"
    Started.accel, Started.time_scale = "", 1.0
    assert guest_description(Started()) == "arm64"


def test_up_shows_the_policy_as_toml_the_token_file_a_curl_line_and_how_to_remove_it(tmp_path):
    policy = NetworkPolicy(mode="allowlist", allow=["HTTPS://Example.COM", "http://localhost:8080"])
    text = policy_toml(policy)
    assert text == 'mode = "allowlist"\nallow = ["https://example.com", "http://localhost:8080"]'
    assert NetworkPolicy(**tomllib.loads(text)) == policy
    assert policy_toml(NetworkPolicy()) == 'mode = "deny-all"'
    token = tmp_path / "ds-1.token"
    for detached, removal in ((False, "Ctrl-C here, or desktop-sandbox down ds-1 from another shell"),
                              (True, "desktop-sandbox down ds-1")):
        console = Console(record=True, width=PIPE_WIDTH, force_terminal=False)
        console.print(sandbox_table("ds-1", "http://127.0.0.1:49153", 3.21, policy, token, detached, "arm64"))
        out = console.export_text()
        assert "guest" in out and "arm64" in out
        assert "/v1/launch" in out.replace("\n│                  │ ", "") and "terminal" in out
        assert "policy [network]" in out and 'mode = "allowlist"' in out
        assert '{"mode"' not in out and "{'mode'" not in out  # TOML, not JSON or a dict
        assert f"{token} (0600, {'kept until `down`' if detached else 'removed on exit'})" in out
        assert f'curl -s -H "Authorization: Bearer $(cat {token})" http://127.0.0.1:49153/v1/display' in out
        assert (f'curl -s -H "Authorization: Bearer $(cat {token})" -o screen.png '
                "http://127.0.0.1:49153/v1/screenshot") in out.replace("\n│                  │ ", "")
        assert removal in out


def test_progress_lines_show_model_guest_and_gateway_text_escaped_and_never_as_emoji(tmp_path):
    """Each kind of source in one record: the model (error message, call id, safety-check code, key
    names), the gateway's log (origin, reason) and the guest (an action's error, a check's observed
    file). A console with rich's defaults (emoji codes on) still prints every one literally."""
    import io

    from tests.controller.hostile_text import EVIL, SHOWN, assert_shown_safely

    out = io.StringIO()
    rec = RunRecord(tmp_path, "r")
    follow_entries(rec.bus, RunPrinter(Console(file=out, width=2000, force_terminal=False)), name="terminal")
    rec.write("model_response", response_id=None, http_status=500, error={"code": "x", "message": EVIL}, usage=None)
    rec.write("computer_call", call_id="c" + EVIL, form="actions", actions=[{"type": "keypress", "keys": [EVIL]}],
              pending_checks=[{"id": "sc", "code": EVIL, "message": EVIL}])
    rec.write("action", call_id="c", action="keypress", duration_ms=1.0, error=EVIL)
    rec.write("network", origin=EVIL, decision="deny", reason=EVIL)
    rec.write("check", kind="file", target="/x", rule="text", expected="a", observed=EVIL, passed=False)
    rec.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 5, lines
    for line in lines:
        assert_shown_safely(line)
    assert SHOWN[:40] in lines[0] and SHOWN[:40] in lines[3]  # the model's message, the gateway's origin


def test_the_cli_console_never_turns_emoji_codes_into_emoji(capsys):
    make_console(stderr=True).print("page title :white_check_mark: :warning:")
    assert "page title :white_check_mark: :warning:" in capsys.readouterr().err


def test_origin_requests_and_the_approve_origin_opt_in_are_one_line_each_escaped(tmp_path):
    from tests.controller.hostile_text import EVIL, SHOWN, assert_shown_safely

    lines = _printed(tmp_path, lambda rec: (
        rec.write("approval", what="opt-in", decision="approved", by="command line", origin="https://a.test",
                  message="--approve-origin https://a.test"),
        rec.write("approval", what="origin_access", decision="timeout", by="timeout", origin="https://b" + EVIL,
                  request_id="oreq_1"),
        rec.write("approval", what="origin_access", decision="approved", by="console", origin="https://a.test",
                  request_id="oreq_2", latency_ms=1500.0)))
    assert lines[0] == "opt-in: origin requests for https://a.test are approved unattended (--approve-origin)"
    assert lines[1].startswith("  origin request https://b") and lines[1].endswith(": timeout (timeout)")
    assert SHOWN[:30] in lines[1]
    assert_shown_safely(lines[1])
    assert lines[2:] == ["  origin request https://a.test: approved (console)", "    answered in 1.5s"]
