"""The browser conformance suite's default target: this project's driver,
:class:`controller.run.browser_driver.GuestBrowserDriver`, over a real local agent whose chromium is
Debian's (:func:`tests.helpers.chromium_desktop`: a private Xvfb 1280x800, the agent as a real
subprocess, chromium as its channel app with the argv ``images/apps.json`` declares).

A factory of your own has the same shape: ``make_driver(base_url)`` returning a driver, or a generator
function yielding it (tests/browser_conformance/harness.py).
"""

from __future__ import annotations

from typing import Any, Iterator

from tests.helpers import chromium_desktop, chromium_missing
from tests.require import unavailable


def guest_driver(base_url: str) -> Iterator[Any]:
    """Yield a ``GuestBrowserDriver`` (no URL rules: the suite's ``url_policy`` lets every URL through)
    of a local agent whose chromium shows ``base_url`` + ``/other``, once the agent reports that tab;
    everything is stopped after. Skips (``DESKTOP_SANDBOX_REQUIRE_BROWSER=1``: fails) without chromium,
    Xvfb or setpriv."""
    from controller.run.browser_driver import GuestBrowserDriver
    from guest.cdp import wait_until

    why = chromium_missing()
    if why:
        unavailable("BROWSER", why)
    with chromium_desktop() as desktop:
        desktop.agent.launch("chromium", [base_url + "/other"])
        driver = GuestBrowserDriver(desktop.agent)

        def showing() -> bool:
            tabs = driver.state()["tabs"]
            return any(t["url"].startswith(base_url) and t["title"] == "Other" for t in tabs)

        assert wait_until(showing, 30, 0.1), "the agent's chromium did not show the site"
        yield driver
