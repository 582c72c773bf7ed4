"""The public Python API (:mod:`desktop_sandbox`) against a hostile caller, on one real Docker sandbox.

Bad input is refused with a :class:`desktop_sandbox.DesktopSandboxError` and nothing reaches the desktop
(the guest's event probe sees no press), however it is malformed: a bare string where key names go, a
drag path of floats or strings, a non-str text, junk where actions go. A refused call keeps no typed text
and nothing unbounded in the record. Bad start arguments are refused before anything starts. Only
``True`` from an approver approves. A call whose caller was interrupted (a real SIGINT) never runs later,
and closing the sandbox while a call waits on an approver ends it within seconds, the record finished
``cancelled``. The ``SandboxAgent`` client refuses a NUL byte in a command with a reason.

One sandbox for the module (the last test closes it); nothing labelled by this module is left running.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.docker._conformance import CONFORMANCE_APPS
from tests.docker.conftest import IMAGE, SESSION_ID, TEST_LABEL
from tests.python_api._probe import probe_events, wait

LOG = "/home/sandbox/hostile-probe.jsonl"
SECRET = "hunter2-hostile-SECRET"


@pytest.fixture(scope="module")
def approver_state() -> dict[str, Any]:
    """What the approver answers (``verdict``; ``block``: wait on ``release`` first) and an event set
    each time it is asked."""
    return {"verdict": True, "block": False, "release": threading.Event(), "asked": threading.Event()}


@pytest.fixture(scope="module")
def sandbox(docker_client, desktop_image, approver_state, tmp_path_factory) -> Iterator[Any]:
    from desktop_sandbox import Sandbox

    def approver(_request: Any) -> Any:
        approver_state["asked"].set()
        if approver_state["block"]:
            approver_state["release"].wait(120)
        return approver_state["verdict"]

    runs = tmp_path_factory.mktemp("runs")
    sb = Sandbox.start(image=IMAGE, runs_dir=runs, confirm_actions=["double_click"], approver=approver,
                       approval_timeout_s=600, apps=[("probe", "--log", LOG)],
                       options={"apps_file": CONFORMANCE_APPS, "extra_labels": {TEST_LABEL: SESSION_ID}})
    try:
        wait(lambda: any(e["type"] == "ready" for e in _events(sb)), "the probe's ready line")
        yield sb
    finally:
        approver_state["release"].set()
        sb.close()


def _events(sb: Any) -> list[dict[str, Any]]:
    return probe_events(sb, LOG)


def _input_after(sb: Any, mark: int) -> list[dict[str, Any]]:
    """Presses (button or key) the probe logged after event ``mark``, once a sentinel move to (3, 3) sent
    now is logged (every event sent before it is logged by then)."""
    now = len(_events(sb))
    sb.move(3, 3)
    wait(lambda: any(e["type"] == "MotionNotify" and (e["x"], e["y"]) == (3, 3) for e in _events(sb)[now:]),
          "the sentinel move")
    return [e for e in _events(sb)[mark:] if e["type"] in ("ButtonPress", "KeyPress")]


def _run_files(run_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file())


def test_malformed_input_is_refused_and_nothing_reaches_the_desktop(sandbox):
    from desktop_sandbox import DesktopSandboxError, DriverError

    sandbox.screenshot()  # model px = screen px
    mark = len(_events(sandbox))
    bad = {
        "keys as a bare string": lambda: sandbox.keypress("ctrl"),  # would be the chord c+t+r+l
        "click holding a bare string": lambda: sandbox.click(5, 5, keys="shift"),
        "drag of floats": lambda: sandbox.drag([(1.7, 1), (2.2, 2)]),
        "drag of bools": lambda: sandbox.drag([(True, 1), (False, 2)]),
        "drag of strings": lambda: sandbox.drag([("1", 1), ("2", 2)]),
        "drag of NaN": lambda: sandbox.drag([(float("nan"), 1), (2, 2)]),
        "drag of triples": lambda: sandbox.drag([(1, 2, 3), (2, 2, 2)]),
        "drag of no path": lambda: sandbox.drag(5),
        "type of bytes": lambda: sandbox.type(b"abc"),
        "actions not a list": lambda: sandbox.actions("click"),
        "actions of ints": lambda: sandbox.actions([5]),
        "no actions": lambda: sandbox.actions([]),
        "a crop of three": lambda: sandbox.screenshot(crop=(0, 0, 1)),
    }
    for what, call in bad.items():
        with pytest.raises(DesktopSandboxError) as caught:
            call()
        assert isinstance(caught.value, DriverError), (what, caught.value)
    sandbox.actions([{"type": "screenshot"}])  # a computer_call's screenshot action: recorded, skipped
    assert _input_after(sandbox, mark) == []
    sandbox.click(7, 7)  # still usable
    assert [(e["x"], e["y"]) for e in _input_after(sandbox, mark) if e["type"] == "ButtonPress"] == [(7, 7)]


def test_a_failed_screenshot_leaves_the_settings_as_they_were(sandbox):
    from desktop_sandbox import AgentError

    with pytest.raises(AgentError):
        sandbox.screenshot(max_width=0)
    run = sandbox.attended_run
    shot = run.call(lambda: run.screenshot())  # the settings of the last screenshot that worked
    assert shot.image_size == (1280, 800)


def test_a_refused_call_keeps_no_typed_text_and_nothing_unbounded_in_the_record(sandbox):
    from desktop_sandbox import DriverError, OutOfModelBounds

    for actions in ([{"type": "type_text", "text": SECRET}], [{"type": "keypress", "keys": ["a"], "text": SECRET}],
                    [{"type": "type", "text": SECRET * 1000}], [{"type": SECRET}],
                    [{"type": "drag", "path": [{"x": 1, "y": 1}] * 100_000}]):
        with pytest.raises(DriverError):
            sandbox.actions(actions)
    with pytest.raises(OutOfModelBounds):
        sandbox.click(5000, 5)  # refused for its bounds only: kept as sent, marked refused
    record = sandbox.record_dir / "record.jsonl"
    assert SECRET.encode() not in _run_files(sandbox.record_dir)
    lines = record.read_text().splitlines()
    assert max(len(line) for line in lines) < 4096
    refused = [json.loads(line) for line in lines if '"refused"' in line]
    assert [e["actions"] for e in refused if e["type"] == "computer_call"][-6:] == [
        [{"type": "unknown", "refused": True}], [{"type": "keypress", "refused": True}],
        [{"type": "type", "refused": True}], [{"type": "unknown", "refused": True}],
        [{"type": "drag", "refused": True}], [{"type": "click", "x": 5000, "y": 5, "button": "left", "refused": True}]]
    assert all(e["error"].startswith("refused: ") for e in refused if e["type"] == "action")


def test_only_true_from_the_approver_approves(sandbox, approver_state):
    from desktop_sandbox import ActionDenied

    mark = len(_events(sandbox))
    for junk in ("no", 1, "False", object()):
        approver_state["verdict"] = junk
        with pytest.raises(ActionDenied):
            sandbox.double_click(20, 20)
    assert _input_after(sandbox, mark) == []
    approver_state["verdict"] = True


def test_bad_start_arguments_are_refused_before_anything_starts(docker_client, tmp_path):
    from desktop_sandbox import DesktopSandboxError, Sandbox

    label = f"hostile-start-{SESSION_ID}"
    bad = [dict(backend="no-such-backend"), dict(policy={"mode": "bogus"}), dict(policy=5),
           dict(screen=(0, 0)), dict(confirm_actions="type"), dict(confirm_actions=["teleport"]),
           dict(options={"no_such_option": 1})]
    for kwargs in bad:
        options = {"extra_labels": {TEST_LABEL: label}, **kwargs.pop("options", {})}
        try:
            started = Sandbox.start(image=IMAGE, runs_dir=tmp_path, options=options, **kwargs)
        except DesktopSandboxError as exc:
            assert str(exc), kwargs
        else:
            started.close()
            pytest.fail(f"started with {kwargs}")
    assert docker_client.containers.list(all=True, filters={"label": f"{TEST_LABEL}={label}"}) == []


def test_the_sandbox_agent_client_refuses_a_nul_byte_with_a_reason(sandbox):
    import asyncio

    from agents.sandbox.errors import ExecTransportError
    from desktop_sandbox.agents_sandbox import DesktopSandboxClient

    async def go() -> None:
        client = DesktopSandboxClient(sandbox=sandbox.backend)
        session = await client.create()
        try:
            await session.start()
            with pytest.raises(ExecTransportError, match="NUL byte"):
                await session.exec("echo", "a\x00b")
            assert (await session.exec("echo", "ok")).stdout == b"ok\n"
        finally:
            await client.delete(session)

    asyncio.run(go())


def test_an_interrupted_call_never_runs_later(sandbox, approver_state):
    from controller.run.record import read_entries

    sandbox.screenshot()
    record = sandbox.record_dir / "record.jsonl"
    mark = len(_events(sandbox))
    approver_state.update(verdict=True, block=True)
    approver_state["asked"].clear()
    approver_state["release"].clear()

    def interrupt() -> None:
        if approver_state["asked"].wait(30):  # the call is under way, waiting on the approver
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        sandbox.double_click(40, 40)
    approver_state["block"] = False
    approver_state["release"].set()  # the approver now says yes: too late, the call is withdrawn
    assert _input_after(sandbox, mark) == []  # a new run takes this call
    finished = [e for e in read_entries(record) if e.type == "run_finished"]
    assert finished and finished[-1].status == "cancelled" and "interrupted" in finished[-1].reason


def test_close_during_a_call_waiting_on_the_approver_ends_it_promptly(sandbox, approver_state, docker_client):
    from controller.run.record import read_entries
    from desktop_sandbox import DesktopSandboxError

    approver_state.update(verdict=True, block=True)
    approver_state["asked"].clear()
    approver_state["release"].clear()
    record, sandbox_id = sandbox.record_dir / "record.jsonl", sandbox.id
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            sandbox.double_click(30, 30)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome["error"] = exc

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert approver_state["asked"].wait(30)
    t = time.monotonic()
    sandbox.close()
    took = time.monotonic() - t
    caller.join(30)
    approver_state["release"].set()
    assert took < 20, f"close took {took:.1f} s while a call waited on the approver"
    assert isinstance(outcome.get("error"), DesktopSandboxError)
    finished = [e for e in read_entries(record) if e.type == "run_finished"]
    assert finished and finished[-1].status == "cancelled"
    assert docker_client.containers.list(all=True, filters={"label": f"desktop-sandbox.sandbox={sandbox_id}"}) == []
