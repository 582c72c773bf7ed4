"""Sign-in forms through the real guest (contract 8): the agent's chromium (as user ``browser``, its
sandbox on) in one sandbox for the module, the demo site's ``/hostile/form/*`` pages (a container on a
Docker network of ours that only the gateway joins; ``http://signin-demo:8081`` stands in for another
origin), filled over the agent's ``/v1/browser/signin``.

* While values are in the fields, a screen grabber run as the desktop user (``sandbox``, the user of
  every command a task's terminal runs) sees the same pixels in the e-mail and code fields for two
  different values of the same length: the characters never reach the shared display.
* A form that would send the values by GET (or ``dialog``, or with no form at all) or to another
  origin (``action``, ``formaction``, a ``<base href>``, ``javascript:``, an action the page moves
  while the values are typed) gets nothing, and the site gets nothing.
* A form the browser's validation stops is ``invalid``, emptied, and never sent; one it lets go is
  ``submitted``.
* A submit the site answers with a 307 or 308 (which send the body again) to another origin is
  ``cross_origin_redirect``, naming that origin, which gets nothing."""

from __future__ import annotations

import json
import secrets
import threading
import urllib.request
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from guest.cdp import wait_until
from tests.helpers import run_signin_site
from wire.browser import FillRequest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ORIGIN = "http://signin-demo:8080"
OTHER = "http://signin-demo:8081"
EMAIL, PASSWORD = "person@example.test", "sandbox-demo-pass"
CREDENTIALS = [{"field_id": "email", "value": EMAIL}, {"field_id": "password", "value": PASSWORD}]

GRABBER = r"""
import hashlib, json, sys
from PIL import Image, ImageChops, ImageGrab
MARKERS = {"email": (255, 0, 255), "code": (0, 255, 255)}
frames = []
for _ in range(int(sys.argv[1])):
    shot = ImageGrab.grab(xdisplay=":99").convert("RGB")
    frame = {}
    for field, rgb in MARKERS.items():
        exact = ImageChops.difference(shot, Image.new("RGB", shot.size, rgb)).convert("L").point(lambda v: 255 * (v == 0))
        box = exact.getbbox()
        frame[field] = None if box is None else hashlib.sha256(shot.crop(box).tobytes()).hexdigest()
    frames.append(frame)
print(json.dumps(frames))
"""
"""A screen grabber of the kind any desktop-user process can run: the whole X screen, then for each
field (found by its background colour: the ``hold`` page's e-mail field is magenta, its code field
cyan) the sha256 of its pixels; one JSON list of ``{field: sha256 | null}`` per frame."""


@pytest.fixture(scope="module")
def guest(docker_client, desktop_image, test_labels) -> Iterator[SimpleNamespace]:
    """``sandbox`` (a started Docker sandbox whose chromium shows the demo site, its gateway on our
    network) and ``site`` (the demo site's URL from this host)."""
    from controller.sandbox import SandboxSpec
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    ident = f"ds-test-signin-forms-{secrets.token_hex(4)}"
    network = docker_client.networks.create(ident, driver="bridge", internal=True, labels=test_labels)
    container = sandbox = None
    try:
        network.reload()
        subnet = network.attrs["IPAM"]["Config"][0]["Subnet"]
        container = run_signin_site(docker_client, desktop_image, network.name, f"{ident}-site", test_labels)
        container.reload()
        address = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        policy = {"mode": "allowlist", "allow": [ORIGIN, OTHER], "allow_addresses": [subnet]}
        sandbox = DockerSandbox.start(SandboxSpec(browser_channel=True, policy=policy),
                                      DockerOptions(image=desktop_image, extra_labels=test_labels), client=docker_client)
        sandbox.attach_gateway(network.name)
        sandbox.agent.launch("chromium", [f"{ORIGIN}/hostile/form/post"])
        yield SimpleNamespace(sandbox=sandbox, site=f"http://{address}:8080")
    finally:
        if sandbox is not None:
            sandbox.close()
        if container is not None:
            container.remove(force=True)
        network.remove()


def open_form(guest: SimpleNamespace, name: str) -> Any:
    """Show ``/hostile/form/NAME`` in the agent's chromium; its sign-in page once it is there."""
    url = f"{ORIGIN}/hostile/form/{name}"

    def there() -> Any:
        try:
            page = guest.sandbox.agent.signin_page()
        except Exception:  # noqa: BLE001 - the browser is still starting or the page loading
            return None
        return page if page is not None and page.url == url and page.form is not None else None
    if there() is None:
        wait_until(lambda: guest.sandbox.agent.signin_page() is not None, 60, 0.2)
        guest.sandbox.agent.browser_call("navigate", {"url": url})
    page = wait_until(there, 30, 0.1)
    assert page is not None, f"the page did not load: {url}"
    return page


def stats(guest: SimpleNamespace) -> dict[str, Any]:
    with urllib.request.urlopen(guest.site + "/stats", timeout=10) as answer:
        return json.loads(answer.read())


def grab(guest: SimpleNamespace, frames: int) -> list[dict[str, str | None]]:
    """``frames`` grabs of the X screen by the desktop user (:data:`GRABBER`)."""
    result = guest.sandbox.exec_in_guest(["python3", "-c", GRABBER, str(frames)], timeout=60)
    assert result.exit_code == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def held_grabs(guest: SimpleNamespace, email: str, code: str, name: str = "hold") -> tuple[list[dict], list[dict]]:
    """Fill the ``hold`` page (or another ``hold-*`` page: ``name``) with ``email``, ``code`` and a password; grab the screen before the fill
    (the fields empty) and while the site holds the submit (the values in the fields), then let the
    submit go. ``(grabs before, grabs while held)``."""
    open_form(guest, name)
    empty = grab(guest, 2)
    ended: dict[str, Any] = {}
    fields = [{"field_id": "email", "value": email}, {"field_id": "code", "value": code},
              {"field_id": "password", "value": PASSWORD}]
    fill = threading.Thread(target=lambda: ended.setdefault("result", guest.sandbox.agent.signin_fill(
        FillRequest(credential_origin=ORIGIN, fields=fields))))
    fill.start()
    try:
        assert wait_until(lambda: stats(guest)["held"] == 1, 30, 0.05), "the submit never reached the site"
        held = grab(guest, 4)
    finally:
        urllib.request.urlopen(guest.site + "/hostile/release", timeout=10).close()
        fill.join(60)
    assert ended["result"].outcome == "submitted"
    return empty, held


@pytest.mark.parametrize("name", ["hold", "hold-unmask"])
def test_values_in_the_fields_are_drawn_so_the_desktop_user_reads_nothing_of_them(guest, name):
    """Same-length e-mails and codes: the desktop user's grabs of each field while the values are in it
    are one image for both values (and not the empty field's), also where the page's own style (a shadow
    root the fields are slotted into) would draw them unmasked."""
    empty, first = held_grabs(guest, "person@example.test", "424242", name)
    _, second = held_grabs(guest, "robots@elsewhere.xy", "171717", name)
    for field in ("email", "code"):
        before = {frame[field] for frame in empty}
        shown = {frame[field] for frame in first + second}
        assert None not in before | shown, f"the {field} field was not on the screen"
        distinct = len(shown)
        assert distinct == 1, f"the desktop user's grabs of the {field} field differ with its value"
        assert shown != before  # the value is there, drawn as discs


@pytest.mark.parametrize("name, method, destination, outcome", [
    ("get", "get", ORIGIN, "unsafe_form"),
    ("dialog", "dialog", ORIGIN, "unsafe_form"),
    ("formmethod-get", "get", ORIGIN, "unsafe_form"),
    ("formless", "", "", "unsafe_form"),
    ("cross-action", "post", OTHER, "cross_origin_form"),
    ("cross-formaction", "post", OTHER, "cross_origin_form"),
    ("base-href", "post", OTHER, "cross_origin_form"),
    ("javascript-action", "post", "null", "cross_origin_form"),
])
def test_a_form_that_would_send_values_by_get_or_to_another_origin_gets_none(guest, name, method, destination,
                                                                              outcome):
    page = open_form(guest, name)
    assert (page.form.method, page.form.destination) == (method, destination)
    before = stats(guest)["sinks"]
    result = guest.sandbox.agent.signin_fill(FillRequest(credential_origin=ORIGIN, fields=CREDENTIALS))
    assert (result.outcome, result.destination, result.navigated) == (outcome, destination, False)
    assert EMAIL not in result.detail and PASSWORD not in result.detail
    assert stats(guest)["sinks"] == before


def test_an_action_moved_to_another_origin_while_the_values_are_typed_is_caught_at_the_submit(guest):
    page = open_form(guest, "late-action")
    assert (page.form.method, page.form.destination) == ("post", ORIGIN)
    before = stats(guest)["sinks"]
    result = guest.sandbox.agent.signin_fill(FillRequest(credential_origin=ORIGIN, fields=CREDENTIALS))
    assert (result.outcome, result.destination) == ("cross_origin_form", OTHER)
    assert stats(guest)["sinks"] == before


@pytest.mark.parametrize("name, fields, outcome, words", [
    ("invalid-email", [{"field_id": "email", "value": "person.example.test"}, CREDENTIALS[1]], "invalid",
     "field email: is not of the field's type"),
    ("pattern", [{"field_id": "code", "value": "12ab56"}], "invalid", "field code: does not match"),
    ("terms", CREDENTIALS, "invalid", "I accept the terms"),
    ("novalidate", [{"field_id": "email", "value": "person.example.test"}], "submitted", ""),
    ("post", CREDENTIALS, "submitted", ""),
])
def test_the_outcome_says_whether_the_browsers_validation_let_the_form_go(guest, name, fields, outcome, words):
    open_form(guest, name)
    before = stats(guest)["sinks"]["/hostile/done"]
    result = guest.sandbox.agent.signin_fill(FillRequest(credential_origin=ORIGIN, fields=fields))
    assert (result.outcome, result.navigated) == (outcome, outcome == "submitted")
    assert words in result.detail and not any(f["value"] in result.detail for f in fields), result.detail
    assert stats(guest)["sinks"]["/hostile/done"] == before + (outcome == "submitted")


@pytest.mark.parametrize("name", ["redirect-307", "redirect-308", "redirect-chain"])
def test_a_submit_the_site_redirects_to_another_origin_sends_that_origin_nothing(guest, name):
    page = open_form(guest, name)
    assert (page.form.method, page.form.destination) == ("post", ORIGIN)
    before = stats(guest)["sinks"]
    result = guest.sandbox.agent.signin_fill(FillRequest(credential_origin=ORIGIN, fields=CREDENTIALS))
    assert (result.outcome, result.destination) == ("cross_origin_redirect", OTHER), result
    assert EMAIL not in result.detail and PASSWORD not in result.detail
    assert stats(guest)["sinks"] == before
