"""The suite itself: a driver that breaks the SDK's rules, or does not do what a member says, fails the
suite's checks. Each broken driver here is a test double around the real driver under test (the
session's), changing one answer; a real driver that is broken in each way on purpose does not exist."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from .harness import BrowserSession
from .test_act import check_click_submits


class Wrapped:
    """Test double: the session's real driver, every member passed through unchanged (subclasses
    change one answer)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def state(self) -> Any:
        return self.inner.state()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TwoActiveTabs(Wrapped):
    """Test double: every tab reported active (the SDK wants exactly one)."""

    def state(self) -> Any:
        state = copy.deepcopy(self.inner.state())
        state["tabs"] = [dict(t, active=True) for t in state["tabs"]] * 2
        return state


class ObservationGoesBack(Wrapped):
    """Test double: the observation's sequence goes back by one each call (unchanged within a call, so
    only the suite's check across calls sees it)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.reads = 0

    def state(self) -> Any:
        state = copy.deepcopy(self.inner.state())
        n = 1000 - self.reads // 2  # the SDK reads the state twice per call, before and after
        self.reads += 1
        state["observation"] = {"version": 1, "sequence": n, "dropped_changes": n, "title_truncated": False,
                                "changes": []}
        return state


class DuplicateRefs(Wrapped):
    """Test double: ``read_page`` reports its first element twice (refs must be unique)."""

    def read_page(self, action: dict[str, Any]) -> Any:
        report = copy.deepcopy(self.inner.read_page(action))
        report["elements"] = report["elements"][:1] * 2
        return report


class NotAnImage(Wrapped):
    """Test double: ``screenshot`` answers a PNG data URL whose bytes are no PNG."""

    def screenshot(self, action: dict[str, Any]) -> Any:
        self.inner.screenshot(action)
        return {"type": "input_image", "image_url": "data:image/png;base64,AAAAAAAA", "detail": "original"}


class ClickDoesNothing(Wrapped):
    """Test double: ``click`` answers success without clicking."""

    def click(self, action: dict[str, Any]) -> None:
        return None


@pytest.fixture
def wrap(browser):
    def make(cls: type[Wrapped]) -> BrowserSession:
        return BrowserSession(cls(browser.driver))  # records nothing: not the target's own calls
    return make


def test_a_state_the_sdk_refuses_fails_the_call(wrap):
    with pytest.raises(AssertionError, match="the SDK rejected the driver's answer"):
        wrap(TwoActiveTabs).call("list_tabs")


def test_an_observation_that_goes_back_fails_the_next_call(wrap):
    broken = wrap(ObservationGoesBack)
    broken.ok("list_tabs")
    with pytest.raises(AssertionError, match="does not continue the one before"):
        broken.call("list_tabs")


def test_a_read_report_the_sdk_refuses_fails_the_call(wrap, site):
    broken = wrap(DuplicateRefs)
    broken.ok("navigate", url=site.base + "/form")
    with pytest.raises(AssertionError, match="the SDK rejected the driver's answer"):
        broken.call("read_page", filter="all")


def test_an_image_that_does_not_decode_fails_the_call(wrap, site):
    broken = wrap(NotAnImage)
    broken.ok("navigate", url=site.base + "/quads")
    with pytest.raises(AssertionError, match="does not decode"):
        broken.call("screenshot")


def test_a_click_that_does_nothing_fails_the_click_check(wrap, site):
    with pytest.raises(AssertionError, match="browser_wait_for"):
        check_click_submits(wrap(ClickDoesNothing), site.base, timeout_ms=300)
