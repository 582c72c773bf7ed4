"""The scroll rule against the guest browser: a scroll of N px moves a firefox-esr page by about N px."""

from __future__ import annotations

import subprocess
import time

import pytest
from Xlib import display as xdisplay

from controller.agent_client import AgentClient
from guest import pointer
from guest.localrun import Xvfb, terminate
from tests.require import require_commands

pytestmark = pytest.mark.slow

PAGE = """<!doctype html><html><head><title>Y0</title></head>
<body style="margin:0;height:100000px;font:16px sans-serif"><p>scroll</p>
<script>addEventListener('scroll', () => { document.title = 'Y' + Math.round(scrollY) })</script>
</body></html>"""


def _scroll_y(dpy) -> int | None:
    name, utf8 = dpy.intern_atom("_NET_WM_NAME"), dpy.intern_atom("UTF8_STRING")
    stack = [dpy.screen().root]
    while stack:
        win = stack.pop()
        try:
            prop = win.get_full_property(name, utf8)
            if prop and prop.value.startswith(b"Y"):
                return int(prop.value.split()[0][1:])
            stack.extend(win.query_tree().children)
        except Exception:  # noqa: BLE001 - windows come and go
            continue
    return None


def _settled(dpy, timeout: float = 20.0, *, moved_from: int | None = None) -> int:
    """The page's scroll position once it has stopped changing (5 equal readings 0.1 s apart); with
    ``moved_from``, first wait until it differs from that (Firefox may react late under load)."""
    deadline = time.monotonic() + timeout
    while moved_from is not None and _scroll_y(dpy) == moved_from and time.monotonic() < deadline:
        time.sleep(0.05)
    last, same = None, 0
    while same < 5 and time.monotonic() < deadline:
        value = _scroll_y(dpy)
        same = same + 1 if value == last and value is not None else 0
        last = value
        time.sleep(0.1)
    assert last is not None, "firefox did not show the page"
    return last


def test_scroll_pixels_match_firefox(make_agent, tmp_path):
    require_commands("X", "firefox-esr", install="apt-get install firefox-esr")
    (tmp_path / "page.html").write_text(PAGE)
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "user.js").write_text('user_pref("browser.shell.checkDefaultBrowser", false);\n')
    server = Xvfb(1280, 800, 24).start()
    browser = subprocess.Popen(["firefox-esr", "--no-remote", "--profile", str(profile), "--kiosk",
                                (tmp_path / "page.html").as_uri()], env=server.env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dpy = xdisplay.Display(server.display)
    try:
        agent = make_agent(server.display)
        with AgentClient(agent.base_url, agent.token, timeout=30) as client:
            deadline = time.monotonic() + 60
            while _scroll_y(dpy) is None and time.monotonic() < deadline:
                time.sleep(0.3)
            client.actions([{"type": "click", "x": 640, "y": 400, "button": "left"}])
            start = _settled(dpy)
            asked = 3 * pointer.SCROLL_PX_PER_CLICK
            client.actions([{"type": "scroll", "x": 640, "y": 400, "scroll_x": 0, "scroll_y": asked}])
            moved = _settled(dpy, moved_from=start) - start
            assert abs(moved - asked) <= pointer.SCROLL_PX_PER_CLICK / 2, (moved, asked)
            client.actions([{"type": "scroll", "x": 640, "y": 400, "scroll_x": 0, "scroll_y": -1}])
            assert _settled(dpy, moved_from=start + moved) < start + moved, "a 1 px scroll up must scroll"
    finally:
        dpy.close()
        terminate(browser, 10)
        server.stop()
