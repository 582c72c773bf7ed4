"""The console's routes through HTTP: approval answers (202 / 202 / 409 / 404 / 400), take over, resume
and cancel, the runs list, recorded screenshots, and run ids and screenshot names that try to leave
their directory."""

from __future__ import annotations

import os


from tests.console.conftest import LIVE_ID, Runner, image_bytes, make_live, wait_state, write_record


def _code(resp) -> str:
    return resp.json()["error"]["code"]


def test_approval_answers_follow_the_registry_semantics(session, live):
    first = live.registry.open("safety_check", "Go on?", call_id="call_1",
                               checks=[{"id": "c1", "code": "malicious_instructions", "message": "hm"}])
    path = f"/runs/{live.run_id}/approvals/{first.id}"
    snap = session.get(f"/runs/{live.run_id}/approvals").json()
    assert [r["id"] for r in snap["pending"]] == [first.id] and snap["pending"][0]["checks"][0]["code"] == "malicious_instructions"

    ok = session.post(path, {"answer": "approve"})
    assert ok.status_code == 202 and ok.json()["state"] == "approved" and ok.json()["by"] == "console"
    assert first.approved and first.by == "console"
    again = session.post(path, {"answer": "approve"})
    assert again.status_code == 202 and first.state == "approved"
    other = session.post(path, {"answer": "deny"})
    assert other.status_code == 409 and _code(other) == "already_decided" and first.approved
    assert session.get(f"/runs/{live.run_id}/approvals").json()["pending"] == []

    unknown = session.post(f"/runs/{live.run_id}/approvals/req_nope", {"answer": "approve"})
    assert unknown.status_code == 404 and _code(unknown) == "unknown_request"

    second = live.registry.open("action", "Type?")
    path2 = f"/runs/{live.run_id}/approvals/{second.id}"
    for bad, code in (({"answer": "yes"}, "invalid_answer"), ({"answer": True}, "invalid_answer"),
                      ({"reply": "approve"}, "invalid_body"), (["approve"], "invalid_body")):
        resp = session.post(path2, bad)
        assert resp.status_code == 400 and _code(resp) == code, (bad, resp.text)
    for raw in (b"{", b'{"answer": "approve", "answer": "deny"}', b"\xff", b""):
        resp = session.post(path2, raw=raw)
        assert resp.status_code == 400 and _code(resp) == "invalid_body", raw
    huge = session.post(path2, raw=b'{"answer": "' + b"a" * 70_000 + b'"}')
    assert huge.status_code == 413 and _code(huge) == "too_large"
    assert second.pending

    live.registry.withdraw_all("run cancelled")
    withdrawn = session.post(path2, {"answer": "approve"})
    assert withdrawn.status_code == 409 and _code(withdrawn) == "withdrawn" and second.state == "withdrawn"


def test_live_only_routes_refuse_recorded_and_unknown_runs(session, runs_dir):
    write_record(runs_dir, "old-run", "2030-01-01T00:00:00.000+00:00", "old", "passed")
    for path in ("/runs/old-run/approvals", "/runs/old-run/events", "/runs/old-run/screen.jpg"):
        resp = session.get(path)
        assert resp.status_code == 404 and _code(resp) == "not_live", path
    resp = session.post("/runs/old-run/takeover")
    assert resp.status_code == 404 and _code(resp) == "not_live"
    resp = session.post("/runs/nope/approvals/req_x", {"answer": "approve"})
    assert resp.status_code == 404 and _code(resp) == "unknown_run"


def test_take_over_resume_and_cancel(session, live):
    runner = Runner(live)
    base = f"/runs/{live.run_id}"
    early = session.post(base + "/cancel")
    assert early.status_code == 409 and _code(early) == "not_started"
    runner.attach(None, (1280, 800))
    take = session.post(base + "/takeover")
    assert take.status_code == 202 and take.json()["state"]["state"] == "pausing"
    runner.pause_at_boundary()
    wait_state(live, "human")
    resume = session.post(base + "/resume")
    assert resume.status_code == 202
    runner.thread.join(10)
    assert not runner.thread.is_alive() and live.state == "running"

    request = live.registry.open("action", "click?")
    cancel = session.post(base + "/cancel")
    assert cancel.status_code == 202
    assert runner.cancelled_by == ["console"] and request.state == "withdrawn"
    live.finish("cancelled")
    for name in ("takeover", "resume", "cancel"):
        over = session.post(f"{base}/{name}")
        assert over.status_code == 409 and _code(over) == "run_finished", name


def test_runs_list_newest_first_live_on_top_unreadable_shown(session, runs_dir, console):
    write_record(runs_dir, "run-a", "2030-01-01T00:00:00.000+00:00", "alpha", "passed")
    write_record(runs_dir, "run-c", "2030-03-01T00:00:00.000+00:00", "gamma", None)
    write_record(runs_dir, "run-b", "2030-02-01T00:00:00.000+00:00", "<b>beta</b>", "failed")
    broken = runs_dir / "run-broken"
    broken.mkdir()
    (broken / "record.jsonl").write_text("{not json\n")
    (runs_dir / "no-record").mkdir()
    live = make_live(runs_dir, "run-live")
    console.add_run(live)

    page = session.get("/")
    assert page.status_code == 200
    text = page.text
    order = [text.index(f'href="{console.auth.base}/runs/{run_id}"') for run_id in ("run-live", "run-c", "run-b", "run-a")]
    assert order == sorted(order), "live first, then newest first"
    assert "no-record" not in text
    row = lambda run_id: text[text.index(f'data-run-id="{run_id}"'):].split("</tr>", 1)[0]  # noqa: E731
    assert "passed" in row("run-a") and "alpha" in row("run-a")
    assert "failed" in row("run-b") and "&lt;b&gt;beta&lt;/b&gt;" in row("run-b") and "<b>beta" not in text
    assert "running" in row("run-c")
    assert "unreadable" in row("run-broken") and "not JSON" in row("run-broken")
    assert "starting" in row("run-live") and "live" in row("run-live")


def test_shots_are_served_and_traversal_is_refused(session, runs_dir, tmp_path):
    run = write_record(runs_dir, "run-s", "2030-01-01T00:00:00.000+00:00", "s", "passed")
    (run / "shot-0001.png").write_bytes(image_bytes("PNG"))
    (run / "shot-0002.jpg").write_bytes(image_bytes("JPEG"))
    (run / "shot-\u0661\u0662\u0663\u0664.png").write_bytes(b"secret: not ASCII digits")
    (tmp_path / "secret.png").write_bytes(b"secret")
    os.symlink(tmp_path / "secret.png", run / "shot-0003.png")
    png = session.get("/runs/run-s/shots/shot-0001.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png" and png.content.startswith(b"\x89PNG")
    jpg = session.get("/runs/run-s/shots/shot-0002.jpg")
    assert jpg.status_code == 200 and jpg.headers["content-type"] == "image/jpeg"
    for name in ("record.jsonl", "shot-1.png", "shot-0001.gif", "shot-0003.png", "%2e%2e%2fsecret.png",
                 "..%2f..%2fsecret.png", "shot-\u0661\u0662\u0663\u0664.png", "shot-0001.png%00"):
        resp = session.get(f"/runs/run-s/shots/{name}")
        assert resp.status_code == 404 and b"secret" not in resp.content, name


def test_run_ids_cannot_leave_the_runs_directory(session, runs_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "record.jsonl").write_text("")
    (outside / "shot-0001.png").write_bytes(b"outside")
    os.symlink(outside, runs_dir / "linked")
    for odd in ("run x", "\u00e9t\u00e9", "run\u0661"):  # real directories, but no id a URL may carry
        write_record(runs_dir, odd, "2030-01-01T00:00:00.000+00:00", "outside", "passed")
        (runs_dir / odd / "shot-0001.png").write_bytes(b"outside")
    assert "outside" not in session.get("/").text
    for run_id in ("%2e%2e", ".", "..%2foutside", "%2e%2e%2foutside", "linked", "a%00b", "run%20x", "\u00e9t\u00e9",
                   "run\u0661"):
        for suffix in ("", "/shots/shot-0001.png"):
            resp = session.get(f"/runs/{run_id}{suffix}")
            assert resp.status_code == 404 and b"outside" not in resp.content, (run_id, suffix, resp.text)


def test_a_finished_run_shows_its_report(session, runs_dir):
    write_record(runs_dir, "run-f", "2030-01-01T00:00:00.000+00:00", "fin", "failed")
    page = session.get("/runs/run-f")
    assert page.status_code == 200 and "because" in page.text and "fin" in page.text
    # the report page's own policy: its inline CSS, no script at all, images only from here
    policy = page.headers["content-security-policy"]
    assert "style-src 'unsafe-inline'" in policy and "default-src 'none'" in policy and "script" not in policy
    assert "x-console-policy" not in page.headers

    (runs_dir / "run-f" / "record.jsonl").write_text("not a record\n")  # unreadable: the summary page says why
    page = session.get("/runs/run-f")
    assert page.status_code == 200 and 'id="problem"' in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'self'")


def test_a_live_run_page_and_then_its_report(session, live, monkeypatch):
    page = session.get(f"/runs/{LIVE_ID}")
    assert page.status_code == 200
    for needle in ('id="screen-img"', ">Take over<", ">Resume<", ">Cancel run<", "/static/console.js",
                   f'data-run-id="{LIVE_ID}"', f'content="{session.csrf}"'):
        assert needle in page.text, needle
    live.finish("passed")
    assert "Take over" not in session.get(f"/runs/{LIVE_ID}").text


def test_the_real_report_of_a_recorded_run_links_its_shots_here(session, runs_dir):
    from controller.run.entries import RunStarted, TaskRef
    from controller.run.record import RunRecord

    with RunRecord(runs_dir, "run-r") as record:
        record.write(RunStarted(task=TaskRef(name="real-report"), mode="offline"))
        record.save_screenshot(image_bytes("PNG", (64, 40)), "image/png", image_size=(64, 40), frame=(0, 0, 64, 40))
        record.finish("passed")
    page = session.get("/runs/run-r")
    assert page.status_code == 200 and "real-report" in page.text
    assert f'src="{session.server.auth.base}/runs/run-r/shots/shot-0001.png"' in page.text and "data:image" not in page.text
    shot = session.get("/runs/run-r/shots/shot-0001.png")
    assert shot.status_code == 200 and shot.content.startswith(b"\x89PNG")


def test_origin_request_answers_through_the_route_reach_the_gateway(session, live, tmp_path):
    """``cancel`` is an answer for an origin request only (400 otherwise); an answer the real gateway
    refuses because its deadline passed is 409 ``expired``, and the entry is marked so; the run's
    events name the kind of each request that changed."""
    from controller.run.origins import GatewayControl, GatewayWatcher
    from tests.controller.origin_gateway import start_ask_gateway, until

    (tmp_path / "gw").mkdir()
    gateway = start_ask_gateway(tmp_path / "gw", ("ask",), hold_timeout_s=1.5)
    control = GatewayControl(gateway.control_url, gateway.token)
    watcher = GatewayWatcher(control, live.registry)  # not watching: the route's answer meets the timeout
    try:
        check = live.registry.open("safety_check", "Go on?")
        refused = session.post(f"/runs/{live.run_id}/approvals/{check.id}", {"answer": "cancel"})
        assert refused.status_code == 400 and _code(refused) == "invalid_answer" and check.pending
        held = gateway.fetch_later(gateway.url("ask"))
        until(lambda: watcher.poll() and [r for r in live.registry.pending() if r.kind == "origin_access"],
              what="the origin request mirrored")
        (request,) = [r for r in live.registry.pending() if r.kind == "origin_access"]
        assert held.result(15) == 403  # the gateway's deadline passed
        late = session.post(f"/runs/{live.run_id}/approvals/{request.id}", {"answer": "approve"})
        assert late.status_code == 409 and _code(late) == "expired"
        assert (request.state, request.by) == ("expired", "timeout")
        changed = [e["changed"] for e in live.events_after(0, 0) if e["kind"] == "approvals"]
        assert [(c["kind"], c["state"]) for c in changed if c["id"] == request.id] == [
            ("origin_access", "pending"), ("origin_access", "expired")]
        assert changed[0]["kind"] == "safety_check"
    finally:
        watcher.stop()
        control.close()
        gateway.stop()
