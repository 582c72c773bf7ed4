"""Debian's ``chromium`` under Playwright, always with Chromium's own sandbox on.

The console's benchmark and the browser tests look at pages the project serves; the browser that shows
them keeps its sandbox like any other (``--no-sandbox`` is never passed). Chromium refuses to start its
sandbox as root, and CI runs as root, so a root caller starts it through ``chromium_as_nobody.sh``, which
hands Playwright's fresh profile directory to the user ``nobody`` and drops to it (``setpriv``) before
starting the browser. A non-root caller starts the browser directly.

A page the browser opens from a file must be readable by ``nobody`` when the caller is root (pytest's
``tmp_path`` is not: read the file and serve it, or use :meth:`Page.set_content`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
"""The browser (Debian's ``chromium`` package; Playwright downloads none)."""

AS_NOBODY = Path(__file__).with_name("chromium_as_nobody.sh")
"""Wrapper that starts :data:`CHROMIUM` as ``nobody`` (used when the caller is root)."""


def unavailable() -> str | None:
    """Why the browser cannot start here (a sentence), or None when it can."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"{CHROMIUM} not installed (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright not installed (pip install playwright)"
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        return "setpriv not found (util-linux): needed to start chromium as nobody when running as root"
    return None


def launch(playwright: Any, **options: Any) -> Any:
    """A headless :class:`playwright.sync_api.Browser` on :data:`CHROMIUM` with its sandbox on.

    ``playwright``: the object ``sync_playwright()`` entered; ``options``: passed to
    ``playwright.chromium.launch`` (``executable_path`` and ``chromium_sandbox`` are set here). Raises
    playwright's ``Error`` when the browser does not start (for example, unprivileged user namespaces
    are off, so the sandbox cannot run).
    """
    executable = str(AS_NOBODY) if os.geteuid() == 0 else CHROMIUM
    return playwright.chromium.launch(executable_path=executable, chromium_sandbox=True, **options)
