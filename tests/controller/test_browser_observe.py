"""Which state read of a model step runs the run's ``before_capture`` chain on the browser path
(:class:`controller.run.browser_driver.StepObservation`, fed the SDK's own response items and the
diagnostics the SDK emits, in the order ``BrowserToolset`` reads the state), and the browser path's hook
leaving nothing behind for a later screenshot line. The whole path against the real agent and chromium is
``tests/loop/test_run_browser_observe.py``."""

from __future__ import annotations

from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

from controller.run.browser_driver import GuestBrowserDriver
from controller.run.record import RunRecord
from controller.run.recording import RecordingHooks
from controller.run.registry import ApprovalRegistry
from controller.run.loops import browser_observe as _browser_observe
from controller.run.runner import _origin_wait

NAMES = ["browser_click", "browser_read_page", "browser_get_page_text"]


def _call(call_id: str, name: str, status: str | None = "completed") -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", call_id=call_id, name=name, arguments="{}", status=status)


def _end(call_id: str, reason: str = "completed", stage: str = "action") -> dict[str, object]:
    """A browser call's end as the SDK reports it (``openai.lib.tool_diagnostics``)."""
    return {"api": "browser", "stage": stage, "reason": reason, "call_id": call_id, "duration_ms": 1.0}


def _reads(driver: GuestBrowserDriver, script: list[object]) -> list[bool]:
    """Run ``script`` (``"read"``: a state read, which asks :meth:`StepObservation.take`; a dict: a
    diagnostic) and return what each read answered."""
    answers = []
    for step in script:
        if step == "read":
            answers.append(driver.observation.take())
        else:
            driver.on_diagnostic(step)
    return answers


def test_the_read_after_the_steps_last_call_runs_the_hook_once():
    driver = GuestBrowserDriver(agent=None)
    driver.plan_step([_call("c1", "browser_read_page"), _call("c2", "browser_click"), _call("c3", "browser_get_page_text")],
                     NAMES)
    # before / after each call; the approval's own "completed" for a state-changing member is not an end
    assert _reads(driver, ["read", _end("c1"), "read", "read",
                           {"api": "browser", "stage": "approval", "reason": "completed", "call_id": "c2"},
                           _end("c2"), "read", "read", _end("c3"), "read", "read"]) == \
        [False, False, False, False, False, True, False]
    # a new step starts over; a step without browser calls runs nothing
    driver.plan_step([_call("c4", "browser_click")], NAMES)
    assert _reads(driver, ["read", _end("c4"), "read"]) == [False, True]
    driver.plan_step([ResponseOutputMessage(type="message", id="m", role="assistant", status="completed", content=[])],
                     NAMES)
    assert _reads(driver, ["read", _end("c4"), "read"]) == [False, False]


def test_after_a_failed_call_the_next_read_runs_it_the_skipped_calls_only_read():
    driver = GuestBrowserDriver(agent=None)
    driver.plan_step([_call("c1", "browser_click"), _call("c2", "browser_click"), _call("c3", "browser_read_page")],
                     NAMES)
    assert _reads(driver, ["read", _end("c1"), "read", "read", _end("c2", "driver_failed"), "read", "read"]) == \
        [False, False, False, True, False]
    # a refused navigation, an argument the SDK refused: failures too
    for stage, reason in (("approval", "refused"), ("arguments", "invalid_input")):
        driver.plan_step([_call("c1", "browser_click"), _call("c2", "browser_click")], NAMES)
        assert _reads(driver, ["read", _end("c1", reason, stage), "read", "read"]) == [False, True, False]


def test_only_complete_calls_of_the_toolset_are_planned():
    driver = GuestBrowserDriver(agent=None)
    # the last item is not one of the toolset's (another tool) or not complete: the click is the last call
    for last in (_call("x", "lookup_weather"), _call("x", "browser_read_page", status="in_progress")):
        driver.plan_step([_call("c1", "browser_click"), last], NAMES)
        assert _reads(driver, ["read", _end("c1"), "read"]) == [False, True]


def test_the_browser_hook_runs_the_chain_and_leaves_no_wait_for_a_later_screenshot(tmp_path):
    registry = ApprovalRegistry(300.0)
    registry.mirror("oreq_test", origin="http://ask.test:80", reason="asks")
    record = RunRecord(tmp_path, "hooks")
    hooks = RecordingHooks(record, driver=None)
    chain = _origin_wait(registry, hooks, lambda: True)  # cancelled: the wait ends at once
    assert chain() is True and hooks.waited_for_origin_ms is not None  # what the next screenshot line would carry
    hooks.waited_for_origin_ms = None
    assert _browser_observe(chain, hooks)() is True
    assert hooks.waited_for_origin_ms is None
    assert _browser_observe(None, hooks) is None
    record.close()
