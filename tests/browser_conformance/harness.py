"""Browser conformance harness: a synchronous ``BrowserDriver`` driven only through the openai SDK's own
``BrowserToolset``, as a model's calls reach it.

A **driver** is anything ``openai.lib.browser.BrowserToolset`` accepts: a ``state()`` answering the SDK's
``BrowserState`` (with a v1 ``observation``: the suite checks tabs opened, dialogs and downloads through
it) and one method per member it serves, each taking that member's arguments dict and returning the
SDK's result. The suite gets it from a **factory** ``make_driver(base_url: str)`` that returns the
driver, or a generator function that yields it (what follows the ``yield`` tears it down);
``base_url`` is ``http://127.0.0.1:PORT`` of the suite's site (tests/browser_site.py), which the driver's
browser must reach. Pass ``--browser-conformance-target=package.module:make_driver`` to pytest.

:class:`BrowserSession` wraps one driver in
``BrowserToolset(driver, members=..., confirm=lambda c: True, url_policy=lambda c, u: True)`` (every
default member the driver implements, plus the explicit-only ones of :data:`EXPLICIT_SERVED` it
implements) and runs each call as ``toolset.execute(ResponseFunctionToolCall(...))``, so the SDK's own
checks of the arguments, the state, read reports and images are on; an answer the SDK rejects fails the
test. Each call's output is read back as the model would see it (:class:`Outcome`: the JSON text's
``ok``, ``result``, ``error`` and ``state``, and the images), and each state must continue the one
before it across calls too (the SDK checks this within one call only).

Units: coordinates (``click_at``, ``hover_at``, ``drag_path``, ``zoom``'s region) are the SDK's
full-viewport coordinates, the pixels of the member's own ``screenshot``; times in ms as the SDK's
fields are, or s where a name says so.
"""

from __future__ import annotations

import base64
import io
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest
from openai.lib import browser as sdk
from openai.types.responses import ResponseFunctionToolCall
from PIL import Image

EXPLICIT_SERVED: tuple[str, ...] = ("click_at", "hover_at", "drag_path", "hold_keys", "set_checked")
"""The SDK's explicit-only members the suite exercises when the driver implements them (the others,
``read_page_scoped``, ``read_diagnostics``, ``run_script``, ``upload_file`` and ``download_file``, are
not part of it)."""
IMAGE_MEMBERS = frozenset({"screenshot", "zoom"})
"""Members whose output carries an image instead of a ``result``."""


@dataclass
class Outcome:
    """One call as the model sees it: ``ok``; ``result`` (None, text or a read report dict; None for
    images and errors); ``error`` (the SDK's or the driver's text, None when ok); ``state`` (the SDK's
    projection of the driver's state after the call: ``tabs`` ``{id, title, url, active}`` with URLs cut
    to their origin, and the ``observation``); ``images`` (the decoded ``input_image`` of ``screenshot``
    and ``zoom``, image px); ``seconds`` (wall time of the ``execute``)."""

    member: str
    ok: bool
    result: Any
    error: str | None
    state: dict[str, Any]
    images: list[Image.Image] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def tabs(self) -> list[dict[str, Any]]:
        return self.state["tabs"]

    @property
    def active(self) -> dict[str, Any]:
        """The active tab (exactly one when there are tabs: the SDK checks it)."""
        return next(t for t in self.tabs if t["active"])

    @property
    def sequence(self) -> int:
        """The observation's ``sequence`` after this call."""
        return self.state["observation"]["sequence"]

    def changes_after(self, sequence: int) -> list[dict[str, Any]]:
        """The observation's changes numbered after ``sequence``."""
        return [c for c in self.state["observation"]["changes"] if c["sequence"] > sequence]


def decode_image(item: dict[str, Any]) -> Image.Image:
    """The image of one ``input_image`` output item (a ``data:image/png`` or ``jpeg`` base64 URL whose
    bytes are that format); AssertionError otherwise."""
    assert item.get("type") == "input_image", item.get("type")
    url = item.get("image_url")
    assert isinstance(url, str), "the image has no image_url (the suite reads the pixels)"
    prefix, _, payload = url.partition(",")
    assert prefix in ("data:image/png;base64", "data:image/jpeg;base64"), f"not a PNG or JPEG data URL: {prefix[:40]!r}"
    try:
        data = base64.b64decode(payload, validate=True)
        image = Image.open(io.BytesIO(data))
        image.load()
    except Exception as exc:  # noqa: BLE001 - any decoder failure: not an image
        raise AssertionError(f"the image does not decode: {type(exc).__name__}: {exc}") from None
    assert image.format == prefix[11:-7].upper(), (image.format, prefix)
    assert image.width > 0 and image.height > 0
    return image.convert("RGB")


class BrowserSession:
    """One driver behind the SDK's ``BrowserToolset`` (module docstring).

    ``exercised``: the set the members that answered ``ok`` are added to (the coverage test reads it),
    or None; :attr:`members`: the members the toolset was built with.
    """

    def __init__(self, driver: Any, exercised: set[str] | None = None) -> None:
        self.driver = driver
        self.exercised = exercised
        implemented = [m for m in (*sdk.DEFAULT_BROWSER_MEMBERS, *EXPLICIT_SERVED) if callable(getattr(driver, m, None))]
        self.members = tuple(m for m in (*sdk.DEFAULT_BROWSER_MEMBERS, *EXPLICIT_SERVED)
                             if m == "list_tabs" or m in implemented)
        self.toolset = sdk.BrowserToolset(driver, members=list(self.members), confirm=lambda c: True,
                                          url_policy=lambda c, u: True)
        self.fields = {tool["name"][len("browser_"):]: list(tool["parameters"]["properties"])
                       for tool in self.toolset.tools}
        self.previous: dict[str, Any] | None = None
        self.calls = 0
        self._recording = True

    @contextmanager
    def unrecorded(self) -> Iterator[None]:
        """Calls in this block do not count as exercising a member (the suite's own set-up)."""
        self._recording = False
        try:
            yield
        finally:
            self._recording = True

    def serves(self, member: str) -> bool:
        return member in self.fields

    def call(self, member: str, **arguments: Any) -> Outcome:
        """``browser_<member>`` with ``arguments`` (the member's nullable fields left out are None),
        through ``BrowserToolset.execute``; the output checked and read back (:class:`Outcome`). Skips
        the test when the driver does not serve ``member``; AssertionError when the SDK rejects the
        driver's answer or the output breaks the SDK's shape."""
        if member not in self.fields:
            pytest.skip(f"the driver does not serve {member}")
        unknown = set(arguments) - set(self.fields[member])
        assert not unknown, f"{member} has no fields {sorted(unknown)}"
        self.calls += 1
        call_id = f"call_conformance_{self.calls}"
        full = {name: arguments.get(name) for name in self.fields[member]}
        call = ResponseFunctionToolCall(type="function_call", call_id=call_id, name="browser_" + member,
                                        arguments=json.dumps(full))
        started = time.monotonic()
        try:
            out = self.toolset.execute(call)
        except RuntimeError as exc:
            raise AssertionError(f"browser_{member}: the SDK rejected the driver's answer ({exc})") from None
        seconds = time.monotonic() - started
        assert out["type"] == "function_call_output" and out["call_id"] == call_id, out
        items = list(out["output"])
        assert items and items[0]["type"] == "input_text", items[:1]
        payload = json.loads(items[0]["text"])
        assert isinstance(payload.get("ok"), bool), payload
        assert "state" in payload, f"browser_{member}: no state in the output: {payload}"
        try:
            state = sdk._state(payload["state"], self.previous)
        except RuntimeError as exc:
            raise AssertionError(f"browser_{member}: the state does not continue the one before ({exc})") from None
        assert "observation" in state, f"browser_{member}: the driver's state has no observation"
        self.previous = state["observation"]
        ok = payload["ok"]
        images: list[Image.Image] = []
        if ok:
            assert "error" not in payload, payload
            if member in IMAGE_MEMBERS:
                assert len(items) == 2 and "result" not in payload, (member, len(items), payload)
                images = [decode_image(items[1])]
            else:
                assert len(items) == 1 and "result" in payload, (member, len(items), payload)
            if self.exercised is not None and self._recording:
                self.exercised.add(member)
        else:
            assert isinstance(payload.get("error"), str) and payload["error"], payload
            assert len(items) == 1, (member, len(items))
        return Outcome(member, ok, payload.get("result"), payload.get("error"), state, images, seconds)

    # -- the calls tests make most -------------------------------------------------------------------
    def ok(self, member: str, **arguments: Any) -> Outcome:
        """:meth:`call`, which must succeed."""
        outcome = self.call(member, **arguments)
        assert outcome.ok, f"browser_{member}({arguments}) failed: {outcome.error}"
        return outcome

    def refused(self, member: str, **arguments: Any) -> Outcome:
        """:meth:`call`, which must fail (``ok`` false, an error text, the state still reported)."""
        outcome = self.call(member, **arguments)
        assert not outcome.ok, f"browser_{member}({arguments}) succeeded where it must fail: {outcome.result!r}"
        return outcome

    def goto(self, url: str) -> dict[str, Any]:
        """``navigate`` to ``url``, then the ``read_page`` report (``filter`` all)."""
        navigated = self.ok("navigate", url=url)
        assert navigated.result is None or isinstance(navigated.result, str)
        return self.ok("read_page", filter="all").result

    def wait_text(self, text: str, timeout_ms: int = 10_000) -> Outcome:
        """``wait_for`` ``text`` in the active tab, which must come within ``timeout_ms``."""
        return self.ok("wait_for", text=text, timeout_ms=timeout_ms)

    def text(self, tab_id: str | None = None) -> str:
        """The ``get_page_text`` report's text."""
        report = self.ok("get_page_text", tab_id=tab_id).result
        assert report["elements"] == [], "get_page_text reported elements"
        return report["text"]

    def until(self, predicate: Callable[[Outcome], Any], timeout: float = 10.0, what: str = "condition") -> Outcome:
        """``list_tabs`` until ``predicate(outcome)`` holds (a bounded wait for a condition, polled every
        50 ms); AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            outcome = self.ok("list_tabs")
            if predicate(outcome):
                return outcome
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; tabs: {outcome.tabs}")
            time.sleep(0.05)  # poll interval of the bounded wait above

    def reset(self) -> None:
        """One tab, on about:blank (unrecorded): what every test starts from."""
        with self.unrecorded():
            tabs = self.ok("list_tabs").tabs
            for tab in tabs:
                if not tab["active"]:
                    self.ok("close_tab", tab_id=tab["id"])
            self.ok("navigate", url="about:blank")


def element(report: dict[str, Any], label: str, role: str | None = None) -> dict[str, Any]:
    """The one element of ``report`` labelled ``label`` (and of ``role`` when given)."""
    found = [e for e in report["elements"] if e["label"] == label and (role is None or e["role"] == role)]
    assert len(found) == 1, (label, role, [(e["role"], e["label"]) for e in report["elements"]])
    return found[0]


def labels(report: dict[str, Any]) -> list[str]:
    return [e["label"] for e in report["elements"]]


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url`` (what the SDK's state shows of a tab's URL)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def pixel(image: Image.Image, fx: float, fy: float) -> tuple[int, int, int]:
    """The RGB of ``image`` at fractions (``fx``, ``fy``) of its width and height."""
    return image.getpixel((min(image.width - 1, int(image.width * fx)), min(image.height - 1, int(image.height * fy))))


def near(colour: tuple[int, int, int], want: tuple[int, int, int], tolerance: int = 24) -> bool:
    """True when every channel of ``colour`` is within ``tolerance`` of ``want`` (JPEG and colour
    management move them a little)."""
    return all(abs(a - b) <= tolerance for a, b in zip(colour, want))
