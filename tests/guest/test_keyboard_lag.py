"""Typing stays exact for an X client that lags behind the keys (guest/keyboard.py, guest/xclients.py).

A text with more distinct unmapped characters than the spare keycodes hold is typed in chunks, the
spare keycodes rebound between them. A client looks a keycode up in the keymap it holds when it gets
to the event, so one that is behind (a busy or emulated guest; here an ``xterm`` stopped with SIGSTOP
for a while) must have handled the earlier presses before a keycode is rebound, or it types other
characters. The time a client is stopped is the stimulus here, not a wait: the agent must notice by
itself when the client has caught up. What the kernel reports (unread bytes of a client's socket, its
process's state) is checked on real sockets and processes.

The X server is this module's own: the rule waits for every client of the display, and the agents
other tests leave running on the shared one never read their own connections.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from guest import xclients
from guest.keyboard import REBIND_WAIT_S
from guest.localrun import Xvfb
from tests.conformance.harness import poll
from tests.require import require_commands

#: More distinct characters than any default keymap has room for (Xvfb's holds 36 at once).
CJK_120 = "".join(chr(0x4E00 + i * 3) for i in range(120))


def _type(agent, text: str) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    resp = httpx.post(agent.base_url + "/v1/actions", json={"actions": [{"type": "type", "text": text}]},
                      headers={"Authorization": f"Bearer {agent.token}"}, timeout=60)
    return resp, time.monotonic() - start


@pytest.fixture(scope="module")
def xvfb():
    """An X server of this module's own (module doc)."""
    server = Xvfb().start()
    yield server
    server.stop()


@pytest.fixture
def sink(xvfb, make_agent, tmp_path):
    """(agent, xterm process, file): an ``xterm`` running ``cat > file``, focused, on the session Xvfb."""
    require_commands("X", "xterm", install="apt-get install xterm")
    agent = make_agent(xvfb.display)
    out = tmp_path / "typed.txt"
    term = subprocess.Popen(
        ["xterm", "-geometry", "120x24+0+0", "-fa", "", "-fn", "fixed", "-u8", "-e", "sh", "-c",
         'stty -echo; exec cat > "$1"', "sink", str(out)],
        env=dict(os.environ, DISPLAY=xvfb.display), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        poll(out.exists, 15, what="the terminal to start")
        resp = httpx.post(agent.base_url + "/v1/actions", headers={"Authorization": f"Bearer {agent.token}"},
                          json={"actions": [{"type": "click", "x": 300, "y": 100, "button": "left"},
                                            {"type": "type", "text": "ready\n"}]}, timeout=30)
        assert resp.status_code == 200, resp.text
        poll(lambda: out.read_text() == "ready\n", 15, what="the terminal to have the keyboard")
        yield agent, term, out
    finally:
        if term.poll() is None:
            os.kill(term.pid, signal.SIGCONT)
            term.kill()
        term.wait()


def test_a_client_stopped_while_keys_come_still_gets_the_exact_text(sink):
    agent, term, out = sink
    os.kill(term.pid, signal.SIGSTOP)
    resume = threading.Timer(1.0, os.kill, (term.pid, signal.SIGCONT))  # the lag: 1 s, four times the old rule's
    resume.start()
    try:
        resp, _ = _type(agent, CJK_120 + "\n")
    finally:
        resume.join()
    assert resp.status_code == 200, resp.text
    typed = poll(lambda: (lambda t: t if t.endswith("\n") and len(t) > len("ready\n") else None)(out.read_text()),
                 20, what="the typed line")
    assert typed == "ready\n" + CJK_120 + "\n"


def test_a_client_that_never_catches_up_costs_a_request_the_cap_once(sink):
    agent, term, out = sink
    os.kill(term.pid, signal.SIGSTOP)
    resp, took = _type(agent, CJK_120)  # three chunks: two rebinds, one budget
    assert resp.status_code == 200, resp.text
    assert REBIND_WAIT_S <= took < REBIND_WAIT_S + 3.0, f"typing took {took:.1f} s (cap {REBIND_WAIT_S:g} s)"
    resp = httpx.get(agent.base_url + "/v1/display", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
    assert resp.status_code == 200


def test_a_client_that_never_reads_costs_one_wait_not_every_one(sink, xvfb):
    agent, term, out = sink
    idle = subprocess.Popen([sys.executable, "-c", "from Xlib import display; import sys; d = display.Display(sys.argv[1]); "
                             "print('up', flush=True); sys.stdin.read()", xvfb.display],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert idle.stdout.readline() == "up\n"  # holds a connection and never reads it (a script's idle Display)
        first, took_first = _type(agent, CJK_120[:60])
        second, took_second = _type(agent, CJK_120[60:] + "\n")  # the terminal passes a line on at Return
        assert first.status_code == second.status_code == 200, (first.text, second.text)
        assert REBIND_WAIT_S <= took_first < REBIND_WAIT_S + 3.0, f"first request took {took_first:.1f} s"
        assert took_second < REBIND_WAIT_S, f"the second request waited again: {took_second:.1f} s"
        try:
            typed = poll(lambda: (lambda t: t if t.endswith("\n") and len(t) > len("ready\n") else None)(
                out.read_text()), 20, what="the typed line")
        except AssertionError:
            typed = out.read_text()
        assert typed == "ready\n" + CJK_120 + "\n"
    finally:
        idle.kill()
        idle.wait()


def test_a_keycode_is_bound_anew_no_sooner_than_the_settle_time_after_its_last_press(xvfb):
    # Whatever the clients were seen doing, a keycode pressed a moment ago is not bound anew at once
    # (part (1) of the rule): texts of 2, 34, 2 and 34 new characters in a row make the last one rebind
    # the keycodes the second one has just pressed.
    from Xlib import display as xdisplay

    from guest.held import Held
    from guest.keyboard import REBIND_SETTLE_S, Keyboard, text_to_keysyms

    dpy = xdisplay.Display(xvfb.display)
    keyboard = Keyboard()
    keyboard.begin(time.monotonic() + 30)
    changes: list[tuple[float, int, int, dict[int, float]]] = []
    change = dpy.change_keyboard_mapping

    def seen(first, rows, *args, **kwargs):  # the real request, its time and the presses before it noted
        changes.append((time.monotonic(), first, len(rows), dict(keyboard._pressed_at)))
        return change(first, rows, *args, **kwargs)

    dpy.change_keyboard_mapping = seen
    try:
        for base, count in ((0x8000, 2), (0x8100, 34), (0x8200, 2), (0x8300, 34)):
            keyboard.type_keysyms(dpy, Held(), text_to_keysyms("".join(chr(base + i) for i in range(count))))
    finally:
        dpy.close()
    rebound = [(at - pressed[k], k) for at, first, n, pressed in changes for k in range(first, first + n) if k in pressed]
    assert rebound, "no keycode was bound anew"
    assert min(rebound)[0] >= REBIND_SETTLE_S, f"keycode {min(rebound)[1]} bound anew {min(rebound)[0]:.3f} s after its press"


def test_a_keypress_waits_for_clients_no_longer_than_its_request(xvfb, make_agent, tmp_path):
    agent = make_agent(xvfb.display, extra_args=["--request-timeout", "2"])
    term = subprocess.Popen(["xterm", "-geometry", "40x5+0+0", "-e", "sh", "-c", "cat > /dev/null"],
                            env=dict(os.environ, DISPLAY=xvfb.display), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        require_commands("X", "xterm", install="apt-get install xterm")
        headers = {"Authorization": f"Bearer {agent.token}"}
        poll(lambda: httpx.post(agent.base_url + "/v1/actions", headers=headers, timeout=10, json={
            "actions": [{"type": "click", "x": 50, "y": 20, "button": "left"}]}).status_code == 200, 15,
            what="the terminal to take a click")
        resp, _ = _type(agent, CJK_120[:36])  # every spare keycode pressed
        assert resp.status_code == 200, resp.text
        os.kill(term.pid, signal.SIGSTOP)
        started = time.monotonic()
        resp = httpx.post(agent.base_url + "/v1/actions", headers=headers, timeout=30,
                          json={"actions": [{"type": "keypress", "keys": [CJK_120[40]]}]})
        took = time.monotonic() - started
        assert resp.status_code in (200, 400), resp.text
        assert took < 2 + 1.5, f"a keypress with a 2 s deadline took {took:.1f} s"
    finally:
        os.kill(term.pid, signal.SIGCONT)
        term.kill()
        term.wait()


_CLIENT = """\
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
print("connected", flush=True)
for line in sys.stdin:
    print(len(s.recv(1 << 20)), flush=True)
"""


def test_unread_bytes_are_the_clients_receive_queue(tmp_path):
    path = str(tmp_path / "server.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen()
        client = subprocess.Popen([sys.executable, "-c", _CLIENT, path], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert client.stdout.readline() == "connected\n"
            conn, _ = server.accept()
            with conn:
                assert xclients.unread_bytes(path) == {}
                conn.sendall(b"x" * 1000)
                [(inode, unread)] = poll(lambda: list(xclients.unread_bytes(path).items()), 5, what="queued bytes")
                assert unread == 1000
                client.stdin.write("read\n")
                client.stdin.flush()
                assert client.stdout.readline() == "1000\n"
                assert xclients.unread_bytes(path) == {}
                # this process's own connections are never counted
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as own:
                    own.connect(path)
                    mine, _ = server.accept()
                    with mine:
                        mine.sendall(b"y" * 10)
                        assert xclients.unread_bytes(path) == {}
        finally:
            client.kill()
            client.wait()


def test_process_state_tells_asleep_stopped_and_gone():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert poll(lambda: xclients.process_state(proc.pid) == "S", 10, what="the child asleep on stdin")
        os.kill(proc.pid, signal.SIGSTOP)
        assert poll(lambda: xclients.process_state(proc.pid) == "T", 10, what="the child stopped")
        os.kill(proc.pid, signal.SIGCONT)
    finally:
        proc.kill()
        proc.wait()
    assert xclients.process_state(proc.pid) == "X"


_FOCUSED_CLIENT = """\
import sys
from Xlib import X, display
d = display.Display(sys.argv[1])
w = d.screen().root.create_window(10, 10, 100, 100, 0, d.screen().root_depth, X.InputOutput, X.CopyFromParent,
                                  event_mask=X.KeyPressMask | X.StructureNotifyMask)
w.map()
d.sync()
while d.next_event().type != X.MapNotify:
    pass
w.set_input_focus(X.RevertToPointerRoot, X.CurrentTime)
d.sync()
print("focused", flush=True)
while True:
    d.next_event()
"""

_BUSY_CLIENT = """\
import sys
from Xlib import display
d = display.Display(sys.argv[1])
print("up", flush=True)
while True:
    d.pending_events()  # reads what comes, never sleeps
"""


def test_the_client_the_keys_go_to_is_waited_for_and_a_busy_other_one_is_not(xvfb):
    from Xlib import display as xdisplay

    dpy = xdisplay.Display(xvfb.display)
    focused = subprocess.Popen([sys.executable, "-c", _FOCUSED_CLIENT, xvfb.display], stdout=subprocess.PIPE, text=True)
    busy = subprocess.Popen([sys.executable, "-c", _BUSY_CLIENT, xvfb.display], stdout=subprocess.PIPE, text=True)
    try:
        assert focused.stdout.readline() == "focused\n" and busy.stdout.readline() == "up\n"
        assert xclients.key_client_pids(dpy) == {focused.pid}
        assert poll(lambda: xclients.process_state(busy.pid) == "R", 10, what="the busy client running")
        assert xclients.wait_until_idle(dpy, time.monotonic() + 10) is None  # the busy one gets no keys
        os.kill(focused.pid, signal.SIGSTOP)
        poll(lambda: xclients.process_state(focused.pid) == "T", 10, what="the focused client stopped")
        assert not xclients.clients_idle(dpy)
        started = time.monotonic()
        assert xclients.wait_until_idle(dpy, started + 0.3) == {}  # stopped after reading all: asleep is what lacks
        assert time.monotonic() - started >= 0.3
        os.kill(focused.pid, signal.SIGCONT)
        assert xclients.wait_until_idle(dpy, time.monotonic() + 10) is None
    finally:
        for proc in (focused, busy):
            proc.kill()
            proc.wait()
        dpy.close()


def test_a_display_that_is_not_local_cannot_be_told():
    with pytest.raises(ValueError):
        xclients.socket_path("remote.example:0")
    assert xclients.socket_path(":99") == "/tmp/.X11-unix/X99"
    assert xclients.socket_path("unix:7.0") == "/tmp/.X11-unix/X7"
    assert xclients.socket_path("unix/:7") == "/tmp/.X11-unix/X7"
    assert Path(xclients.X_SOCKET_DIR).name == ".X11-unix"
