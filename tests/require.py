"""Skips that CI turns into failures: a test that needs something this machine lacks is skipped with the
reason, unless ``DESKTOP_SANDBOX_REQUIRE_<WHAT>=1`` says it must run, where that is a failure. The
variables (listed in docs/tests.md, set by .ci/run): ``IMAGE`` (Docker engine and the guest image), ``GATEWAY``
(mitmproxy), ``VM`` (QEMU and the VM image), ``X`` (Xvfb, xterm, openbox, firefox-esr), ``VAGRANT``,
``BROWSER`` (Debian's chromium and Playwright, to open a page in a real browser).
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def unavailable(what: str, reason: str) -> NoReturn:
    """Skip with ``reason``, or fail when ``DESKTOP_SANDBOX_REQUIRE_<what>=1``."""
    variable = f"DESKTOP_SANDBOX_REQUIRE_{what}"
    if os.environ.get(variable) == "1":
        pytest.fail(f"{reason} ({variable}=1)")
    pytest.skip(reason)


def require_commands(what: str, *commands: str, install: str) -> None:
    """:func:`unavailable` unless every command is on PATH; ``install`` says how to get them."""
    missing = [c for c in commands if shutil.which(c) is None]
    if missing:
        unavailable(what, f"{', '.join(missing)} not installed ({install})")


def require_browser() -> str:
    """:data:`controller.chromium.CHROMIUM`'s path, after :func:`unavailable` (``BROWSER``) unless the
    browser can start here (:func:`controller.chromium.unavailable`). Start it with
    :func:`controller.chromium.launch` (its sandbox on)."""
    from controller import chromium

    why = chromium.unavailable()
    if why:
        unavailable("BROWSER", why)
    return chromium.CHROMIUM
