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


APPS_JSON = Path(__file__).resolve().parents[1] / "images" / "apps.json"
"""The guest's app allowlist; its ``chromium`` entry is the agent's channel app (contract 8)."""


def profile_tree(top: Path, *subdirs: str) -> list[str]:
    """Make ``top/profile`` (and ``top/<name>`` for each of ``subdirs``) for a chromium this process
    starts outside Playwright: created, and when the caller is root handed to ``nobody`` (``top`` made
    0755 so ``nobody`` can reach them; Chromium refuses to run its sandbox as root). Returns the argv
    prefix that starts a program as that user (``setpriv ... --``; empty when not root). Raises OSError
    when a directory cannot be made or handed over."""
    names = ("profile", *subdirs)
    for name in names:
        (top / name).mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return []
    for name in names:
        shutil.chown(top / name, "nobody", "nogroup")
    os.chmod(top, 0o755)
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def channel_app(top: Path, extra: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """The agent's apps mapping ``{"chromium": {"argv": [...], "channel": ...}}`` for a local agent (the
    benchmark, the tests): :data:`APPS_JSON`'s chromium entry with its ``--user-data-dir`` in
    ``top/profile`` (:func:`profile_tree`), run as ``nobody`` with that directory as ``HOME`` when the
    caller is root, plus ``extra`` arguments. Raises OSError (as :func:`profile_tree`; also when
    :data:`APPS_JSON` is missing, outside a checkout) or KeyError (no chromium entry)."""
    import json

    prefix = profile_tree(top)
    profile = top / "profile"
    if prefix:
        prefix = [*prefix, "env", f"HOME={profile}"]
    declared = json.loads(APPS_JSON.read_text())["chromium"]
    argv = [a if not a.startswith("--user-data-dir=") else f"--user-data-dir={profile}" for a in declared["argv"]]
    return {"chromium": {"argv": [*prefix, *argv, *extra], "channel": declared["channel"]}}
