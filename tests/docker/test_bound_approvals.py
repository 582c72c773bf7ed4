"""What binding an approval to the screen costs, and how often it refuses although nothing moved, against
a real Docker sandbox's agent (contract 6, "Bound approvals"; the rule: wire/screen_match.py). The
figures are printed in pytest's terminal summary ("approvals bound to the screen").

* **Cost per approved call** (ms): the same ``POST /v1/actions`` (one ``move`` onto the demo page's Pay
  button, screen px) with and without ``expect_screen`` (bound to a screenshot of that screen), through
  the sandbox's own :class:`controller.agent_client.AgentClient` route, :data:`COST_SAMPLES` of each,
  sampled round-robin (:func:`controller.bench_sampling.interleave`); the cost is the difference of the
  medians. Beside it, what making the binding costs the controller (:func:`wire.screen_match.bind`: crop
  and PNG-encode the regions) and the request body's extra bytes.
* **False refusals**: :data:`APPROVALS` approved clicks on each of two demo pages where nothing moves --
  ``/pay?clock=1`` (a clock redrawn every 200 ms far from the button; each click pays) and the pickup
  form (clicks into its fields, where a caret blinks, and on its radio buttons) -- each bound, as a run
  binds it, through :class:`controller.run.driver.SandboxDriver`: a fresh screenshot (the driver's settle
  ``wait`` and capture), ``bind_next``, then the click; a :class:`controller.run.driver.ScreenChanged`
  is a refusal. Each page also gets one control that must be refused (the button moved; text typed
  where the click lands), so a binding that never refuses cannot pass.

One sandbox for the module, about a minute in all.
"""

from __future__ import annotations

import io
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from controller.bench_sampling import interleave, percentiles
from controller.run.driver import SandboxDriver, ScreenChanged, ScreenshotPolicy
from controller.run.tasks import load_task
from tests.conformance.harness import poll
from tests.helpers import timings_section
from wire.screen_match import bind, changed_share

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "tasks" / "bound-approval-demo.toml"
COST_SAMPLES = 40
"""Requests of each kind (with and without ``expect_screen``) for the cost."""
APPROVALS = 25
"""Bound clicks on each page for the false-refusal rate."""
READY_S = 60.0
"""Longest wait for a page to show (seconds)."""
GUEST_PYTHON = "/opt/desktop-sandbox/bin/python"
BUTTON = (640, 314)
"""The Pay button's centre, screen px (images/pickup/app.py ``PAY_LAYOUT``, page y + 86)."""
BUTTON_TOP = (572, 289, 136, 6)
"""x, y, w, h (screen px): a strip along the button's top edge at its place; green while it is there."""
MOVED_TOP = (572, 409, 136, 6)
"""The same strip once the button moved 120 px down."""
GREEN = (0x2F, 0x7D, 0x32)
NAME_FIELD = (600, 180, 200, 10)
"""x, y, w, h (screen px) inside the pickup form's Name field: white once the form shows."""
TYPED = (454, 182, 40, 24)
"""x, y, w, h (screen px): where the first letters typed into the Name field show."""
FORM_CLICKS = [(470, 194), (470, 252), (455, 302), (635, 302), (815, 302), (470, 362)]
"""Where the form's clicks land, screen px: the Name, Date and Items fields near their left edge (where
the caret blinks once focused: the fields are empty) and the three time-window radio buttons
(images/pickup/app.py ``form``: fields from x 440, radios at 85 px left of ``LAYOUT["window"]``)."""

_rows: list[tuple[str, dict[str, Any]]] = []


class _Summary:
    """Prints what this module measured in pytest's terminal summary (``tests.helpers.timings_section``)."""

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        timings_section(terminalreporter, "approvals bound to the screen", _rows, str)


@pytest.fixture(scope="module", autouse=True)
def _summary(request: pytest.FixtureRequest) -> None:
    if not request.config.pluginmanager.has_plugin("bound-approvals-summary"):
        request.config.pluginmanager.register(_Summary(), "bound-approvals-summary")


@pytest.fixture(scope="module")
def sandbox(docker_client, desktop_image, test_labels) -> Iterator[Any]:
    """A sandbox of the demo task (deny-all, 1280x800) with the browser at ``/pay?clock=1``, once the
    button shows."""
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    from .conftest import record_ready

    task = load_task(TASK)
    sb = DockerSandbox.start(task.sandbox_spec(), DockerOptions(image=desktop_image, extra_labels=test_labels),
                             client=docker_client)
    record_ready(f"sandbox {sb.id} (bound approvals)", sb.timings)
    with sb:
        sb.agent.launch("browser", ["http://127.0.0.1:8080/pay?clock=1"])
        wait_screen(sb.agent, lambda img: share(img, BUTTON_TOP, GREEN) >= 0.9, "the Pay button")
        yield sb


# -- helpers ------------------------------------------------------------------------------------------
def grab(agent: Any) -> Image.Image:
    """The screen now (PNG, 1280x800), RGB."""
    return Image.open(io.BytesIO(agent.screenshot(format="png").data)).convert("RGB")


def share(image: Image.Image, region: tuple[int, int, int, int], rgb: tuple[int, int, int], tolerance: int = 24) -> float:
    """Share (0-1) of the region's pixels within ``tolerance`` of ``rgb`` in every channel."""
    x, y, w, h = region
    crop = image.crop((x, y, x + w, y + h))
    return 1.0 - changed_share(Image.new("RGB", crop.size, rgb), crop, tolerance)


def wait_screen(agent: Any, predicate: Any, what: str) -> Image.Image:
    """Agent screenshots until ``predicate(image)``; that image (fails after :data:`READY_S`)."""
    return poll(lambda: (lambda img: img if predicate(img) else None)(grab(agent)), timeout=READY_S,
                interval=0.1, what=what)


ADDRESS_SELECTED = (262, 57, 200, 12)
"""x, y, w, h (screen px) inside the browser's address bar, over the page's address: the selection's
colour once the bar has the focus with the address selected (Ctrl+L)."""
SELECTION = (53, 132, 228)


def navigate(agent: Any, address: str, predicate: Any, what: str) -> Image.Image:
    """Open ``address`` in the browser's tab through its address bar until ``predicate(image)``; that
    image. Ctrl+L, then the address typed and Return once the bar shows the address selected: keys sent
    right after Ctrl+L in the same request reach the page, not the bar (the browser moves the focus
    only once its content process let the shortcut through)."""
    agent.actions([{"type": "keypress", "keys": ["CTRL", "l"]}])
    wait_screen(agent, lambda img: share(img, ADDRESS_SELECTED, SELECTION) >= 0.5, "the address bar to have the focus")
    agent.actions([{"type": "type", "text": address}, {"type": "keypress", "keys": ["Return"]}])
    return wait_screen(agent, predicate, what)


def page_call(sb: Any, method: str, path: str) -> dict[str, Any]:
    """``method path`` to the demo app from inside the guest (``docker exec``, no proxy); its JSON."""
    script = ("import sys, urllib.request as u\n"
              "r = u.Request('http://127.0.0.1:8080' + sys.argv[2], method=sys.argv[1],"
              " data=b'' if sys.argv[1] == 'POST' else None)\n"
              "print(u.build_opener(u.ProxyHandler({})).open(r, timeout=10).read().decode())\n")
    result = sb.exec_in_guest([GUEST_PYTHON, "-c", script, method, path], timeout=30)
    assert result.exit_code == 0, result.stderr.decode()
    return json.loads(result.stdout.decode())


def task_policy() -> ScreenshotPolicy:
    """The demo task's screenshot policy (PNG, the 1280x800 screen as it is)."""
    model = load_task(TASK).model
    return ScreenshotPolicy(format=model.format, quality=model.quality, max_width=model.max_width,
                            max_height=model.max_height, crop=model.crop, max_bytes=model.max_bytes)


POLICIES = {
    "png 1280x800": task_policy,
    "jpeg q60 1024x640": lambda: ScreenshotPolicy(format="jpeg", quality=60, max_width=1024, max_height=640),
}
"""The screenshots approvals are bound to: the demo task's, and a scaled-down JPEG (model px != screen px,
the agent scales and encodes its grab the same way before comparing)."""


def bound_drivers(agent: Any) -> dict[str, SandboxDriver]:
    """One run's driver per :data:`POLICIES` entry, approvals bound by the demo task's rule."""
    rule = load_task(TASK).approvals.rule()
    assert rule is not None
    drivers = {}
    for name, policy in POLICIES.items():
        driver = SandboxDriver(agent, policy())
        driver.bind_rule = rule
        drivers[name] = driver
    return drivers


def bound_click(driver: SandboxDriver, point: tuple[int, int], change: Any = None) -> str | None:
    """One approved click at ``point`` (screen px), bound as a run binds it: a fresh screenshot (the
    driver's settle ``wait`` and capture: the model's), ``bind_next`` on it, the click in model px.
    ``change()``, when given, runs between the binding and the click. None when the click ran, else
    the refusal (``screen_changed``)."""
    shot = driver.capture()
    action = {"type": "click", "x": round(point[0] * shot.image_size[0] / shot.frame.w),
              "y": round(point[1] * shot.image_size[1] / shot.frame.h), "button": "left"}
    assert driver.bind_next([action]) is not None
    if change is not None:
        change()
    try:
        driver.click(action)
    except ScreenChanged:
        return str(driver.last_error)
    return None


STILL_S = 5.0
"""Longest wait for the square around a click's point to be drawn the same twice in a row (seconds)."""


def wait_still(agent: Any, point: tuple[int, int]) -> None:
    """Grab the screen until two grabs in a row show the same square around ``point`` (the rule's
    margin, screen px): what the click before drew there (a focus ring, a radio's dot) is drawn. A caret
    blinking there may keep it from ever holding: then after :data:`STILL_S` as it is."""
    x, y = point
    box = (x - 24, y - 24, x + 25, y + 25)
    deadline = time.monotonic() + STILL_S
    last = grab(agent).crop(box)
    while time.monotonic() < deadline:
        now = grab(agent).crop(box)
        if changed_share(last, now, 0) == 0:
            return
        last = now


def approve_clicks(agent: Any, drivers: dict[str, SandboxDriver],
                   points: list[tuple[int, int]]) -> dict[str, list[str]]:
    """A bound click (:func:`bound_click`) per point and driver, the drivers in turn, each on a screen
    where nothing moves at the point (:func:`wait_still`: a false refusal is one where nothing moved);
    each driver's refusals."""
    refused: dict[str, list[str]] = {name: [] for name in drivers}
    for point in points:
        for name, driver in drivers.items():
            wait_still(agent, point)
            error = bound_click(driver, point)
            if error is not None:
                refused[name].append(error)
    return refused


# -- the cost -------------------------------------------------------------------------------------------
def test_the_cost_of_a_binding_per_approved_call(sandbox):
    agent = sandbox.agent
    rule = load_task(TASK).approvals.rule()
    actions = [{"type": "move", "x": BUTTON[0], "y": BUTTON[1]}]
    agent.actions(actions)
    shot = agent.screenshot(format="png")
    with Image.open(io.BytesIO(shot.data)) as img:
        image = img.convert("RGB")
    bind_ms = []
    for _ in range(COST_SAMPLES):
        started = time.perf_counter()
        binding = bind(image, tuple(shot.frame), [BUTTON], rule)
        bind_ms.append((time.perf_counter() - started) * 1000.0)
    expect = binding.model_dump(mode="json")
    samples = interleave({"plain": (lambda i: agent.actions(actions), COST_SAMPLES),
                          "bound": (lambda i: agent.actions(actions, expect_screen=expect), COST_SAMPLES)},
                         warmup=3)
    plain, bound = percentiles(samples["plain"]), percentiles(samples["bound"])
    cost = round(bound["p50"] - plain["p50"], 2)
    extra_bytes = len(json.dumps({"expect_screen": expect}))
    _rows.append((f"cost per approved call ({COST_SAMPLES} of each, interleaved, one click-free move)", {
        "POST /v1/actions p50": f"{plain['p50']:.2f} ms (p95 {plain['p95']:.2f})",
        "with expect_screen p50": f"{bound['p50']:.2f} ms (p95 {bound['p95']:.2f})",
        "binding": f"+{cost:.2f} ms ({bound['p50'] / plain['p50']:.2f}x)",
        "bind() in the controller p50": f"{statistics.median(bind_ms):.2f} ms",
        "body": f"+{extra_bytes} bytes ({len(binding.regions)} region)",
    }))
    # the check ran each time (a refusal would have raised); what it costs stays small beside a step
    assert cost < 50.0, (plain, bound)


# -- false refusals ---------------------------------------------------------------------------------------
def test_no_false_refusals_on_the_clock_page_and_the_pickup_form(sandbox):
    agent = sandbox.agent
    drivers = bound_drivers(agent)
    task_driver = drivers["png 1280x800"]

    # the clock page: every click on the button, the clock redrawing far from it
    before = len(page_call(sandbox, "GET", "/api/pay/clicks")["clicks"])
    clock = approve_clicks(agent, drivers, [BUTTON] * APPROVALS)
    state = page_call(sandbox, "GET", "/api/pay/clicks")
    pressed = sum(c["on_button"] for c in state["clicks"][before:])

    def move() -> None:  # control: the button moves after the screenshot, before the click
        page_call(sandbox, "POST", "/api/pay/move")
        wait_screen(agent, lambda img: share(img, MOVED_TOP, GREEN) >= 0.9, "the button to move")
    moved_refused = bound_click(task_driver, BUTTON, move) is not None

    # the pickup form, opened in the same tab
    navigate(agent, "127.0.0.1:8080/", lambda img: share(img, NAME_FIELD, (255, 255, 255), 8) >= 0.95,
             "the pickup form")
    form = approve_clicks(agent, drivers, [FORM_CLICKS[i % len(FORM_CLICKS)] for i in range(APPROVALS)])

    def type_name() -> None:  # control: text typed into the Name field where the click lands
        agent.actions([{"type": "type", "text": "Ada Lovelace"}])
        wait_screen(agent, lambda img: share(img, TYPED, (255, 255, 255), 48) < 0.9, "the typed name to show")
    def empty_name() -> None:
        """The Name field focused and emptied (click, then Ctrl+A and Backspace), the whole again when
        the screen does not show it empty: under load the click's focus may come after the keys."""
        for attempt in range(3):
            agent.actions([{"type": "click", "x": 470, "y": 194, "button": "left"}])
            agent.actions([{"type": "keypress", "keys": ["CTRL", "a"]}, {"type": "keypress", "keys": ["BACKSPACE"]}])
            try:
                poll(lambda: share(grab(agent), TYPED, (255, 255, 255), 48) >= 0.9, timeout=READY_S / 3,
                     interval=0.1, what="the Name field to empty")
                return
            except AssertionError:
                if attempt == 2:
                    raise

    typed_refused = {}
    for name, driver in drivers.items():  # the field emptied and focused, then bound, then typed into
        empty_name()
        typed_refused[name] = bound_click(driver, (470, 194), type_name) is not None

    _rows.append((f"false refusals ({APPROVALS} bound clicks a page and screenshot kind, nothing moved)", {
        **{f"clock page, {name}": f"{len(clock[name])}/{APPROVALS}" for name in drivers},
        **{f"pickup form, {name}": f"{len(form[name])}/{APPROVALS}" for name in drivers},
        "presses on the Pay button": f"{pressed} ({state['payments']} paid)",
        "controls refused": f"button moved ({next(iter(drivers))}) {moved_refused}, "
                            + ", ".join(f"text typed ({n}) {r}" for n, r in typed_refused.items()),
    }))
    assert (clock, form) == ({n: [] for n in drivers}, {n: [] for n in drivers}), \
        "bound clicks refused although nothing moved there"
    assert pressed == APPROVALS * len(drivers)  # every bound click on the clock page ran, on the button
    assert moved_refused and all(typed_refused.values()), "a binding that never refuses"
