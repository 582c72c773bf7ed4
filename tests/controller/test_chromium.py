"""The browser the console's tests and benchmark use keeps Chromium's sandbox on, also when the tests run
as root (controller.chromium): the browser reports itself sandboxed and none of its processes is root."""

from __future__ import annotations

import os
from pathlib import Path

from tests.require import require_browser


def _browser_processes() -> list[tuple[int, int]]:
    """(pid, real uid) of every process whose executable is chromium's."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if exe.startswith("/usr/lib/chromium/"):
            uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
            found.append((int(entry.name), uid))
    return found


def test_chromium_runs_sandboxed_and_never_as_root():
    require_browser()
    from playwright.sync_api import sync_playwright

    from controller.chromium import launch

    before = {pid for pid, _ in _browser_processes()}
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page()
            page.goto("chrome://sandbox")
            report = page.inner_text("body")
            ours = [(pid, uid) for pid, uid in _browser_processes() if pid not in before]
        finally:
            browser.close()
    assert "You are adequately sandboxed." in report, report[:2000]
    assert ours, "no chromium process found"
    assert all(uid != 0 for _, uid in ours), ours
