"""Benchmark: the guest agent against the usual per-action-process baseline, and the controller's real
path into a Docker sandbox, each beside its floor, all measured in one run.

``python -m controller.bench [--iterations N] [--baseline-iterations M] [--no-baseline] [--image TAG]
[--no-docker] [--console-iterations K] [--no-console] [--browser] [--browser-iterations B] [--json FILE]``

**Loopback.** A private Xvfb 1280x800x24 with a few terminals full of text (a realistic, compressible
screen), the agent as a real subprocess on 127.0.0.1, wall time per operation in ms:

- ``floor``: grab + PNG encode in this process (:class:`guest.capture.Capture`), no HTTP;
- ``click+screenshot png`` / ``jpeg``: ``POST /v1/actions`` (one click) then ``GET /v1/screenshot``;
- ``screenshot png``: ``GET /v1/screenshot`` alone;
- ``type 100 ascii`` / ``type 100 unicode``: one ``type`` action into a terminal;
- ``wait (idle screen)``: one ``wait`` action on a screen nothing draws on;
- ``settled step``: what the controller does per model step, through :class:`controller.run.driver.SandboxDriver`:
  a click, then the screenshot, which the driver precedes with a ``wait`` because input happened (the
  ``wait`` and the screenshot in one request, ``POST /v1/actions?screenshot=png``).

Baseline, the way many tools do it: one ``xdotool`` process per action (``mousemove X Y click 1``,
``type`` with its default per-character delay) and ImageMagick ``import -window root png:-`` /
``jpeg:-`` per screenshot. ``ratio`` = baseline p50 / agent p50.

**Sandbox** (``--backend docker``, the default, or ``vm``; skipped, with the reason on one line, without
the engine, QEMU or the image): a sandbox from ``--image`` with the demo app's page in the browser and a
terminal, as ``tasks/pickup.toml`` lays them out, the page's input unfocused so nothing blinks (an idle
screen). Measured through the controller's real path, driver -> ``AgentClient`` -> (Docker: the gateway's
relay at its egress address where the host routes there, as the sandbox's own client does, else the
published port; VM: QEMU's forwarded port) -> agent, and at each hop on the way, all with the request a
driver step makes (``POST /v1/actions?screenshot=png`` holding one click):

- ``in-guest floor``: grab + PNG encode inside the guest, no HTTP (a script run in the guest with
  ``exec_in_guest``, the same :class:`guest.capture.Capture` and screenshot size the driver asks for);
- ``in-guest click+screenshot, no HTTP``: the same script, each shot after the driver's click run by
  the agent's own :class:`guest.actions.Executor` in that process: what a step costs in the guest with
  no transport at all, the browser's reaction to the click included (the floor of the path target);
- ``hop: agent HTTP, in the guest`` (Docker): :data:`HOP_SCRIPT` (``http.client``, one kept-alive
  connection) in the desktop container as the agent's user, to the agent on 127.0.0.1: the agent's HTTP;
- ``hop: gateway -> agent`` (Docker): the same script in the gateway container, over the internal network;
- ``hop: host -> relay`` / ``hop: host -> published port`` (Docker), ``hop: host -> forwarded port``
  (VM): the same script on the host;
- ``hop: AgentClient`` : the controller's client (httpx, caps and deadlines) on the sandbox's own route;
- ``driver click+screenshot``: ``SandboxDriver.click`` then ``SandboxDriver.screenshot`` (no settle),
  the call planned as the run's recording hooks plan it from the model's answer
  (``SandboxDriver.plan_calls``): the click goes with the call's capture in one request;
- ``settled step``: the same with the driver's settle (the click, a ``wait`` and the screenshot).

``settle cost`` = settled step p50 - click+screenshot p50 (same path), what the settle adds per step;
``path cost`` = driver click+screenshot p50 - in-guest click+screenshot p50, what the way from the
driver to the guest (client, relay, HTTP) adds per step; each hop's cost is its p50 less the p50 of the
hop before it.

**Web console** (:mod:`controller.bench_console`; skipped, with the reason, without Xvfb, Debian's chromium
or Playwright): action-to-pixels in the console's page beside its floor (the same click straight to the
agent, its screenshot polled), and the controller's CPU cost of the live view at 5 frames a second,
one tab showing it and five (one grab loop serves them all).

**Browser tools** (``--browser``; skipped, with the reason, without Xvfb, Debian's chromium, setpriv as
root, or ``images/apps.json``): the agent as a real subprocess on a private Xvfb 1280x800x24 with
Debian's chromium as its channel app (the argv ``images/apps.json`` declares, run as ``nobody`` when
root), showing :data:`BROWSER_PAGE` (a form of some twenty controls and a page of text, served on
127.0.0.1). One model step each way, on the same page and the same button, sampled round-robin:

- ``browser step (BrowserToolset)``: ``read_page`` (filter all) + ``click`` (the button's ref from that
  read) + ``screenshot`` (the viewport, PNG), each one ``BrowserToolset.execute`` over
  :class:`controller.run.browser_driver.GuestBrowserDriver`, as a run's browser calls go (the SDK reads
  the state before and after each member: three requests a member); its members also apart
  (``browser read_page`` / ``click`` / ``screenshot``, timed inside the step);
- ``browser step (driver only)``: the same three members straight on the driver (no state reads);
- ``computer step (settled)``: the computer driver's step, :class:`SandboxDriver` click on the same
  button (its screen px from the browser click's ``target`` and ``viewport``) then the screenshot with the
  settle (the click, a ``wait`` and the capture of the whole screen in one request);
- ``computer click+screenshot (no settle)``: the same without the settle.

``browser / computer`` = browser step (BrowserToolset) p50 / computer step (settled) p50.

Sampling: every case of a group is sampled round-robin (sample i of each case before sample i+1 of
any), agent and baseline alike, so load on the machine spreads over all of them; the in-guest rows run
in blocks between rounds of driver samples. p50 is the median; p95 is the nearest-rank percentile
(the ceil(0.95 n)-th smallest sample).

Targets checked: loopback click+screenshot PNG p50 <= 20 ms and >= 10x the baseline; settled step p50
< 150 ms (loopback, and in the sandbox); driver click+screenshot p50 <= in-guest click+screenshot (no
HTTP) p50 + 1.5 ms (the path costs at most 1.5 ms a step); console action-to-pixels p50 < 150 ms; the
browser receives the live view's 5 fps.

One module (about 490 lines): the two sections share the report, and each target sits beside the
measurement it judges; the console's section, with its browser, is its own; the sampling and the
percentiles both take are :mod:`controller.bench_sampling`; the browser tools section sits here too, beside
the computer step it is compared with.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller.agent_client import AgentClient
from controller.bench_sampling import interleave, percentiles
from controller.bench_console import checks as console_checks, render_lines as console_lines, run_console
from controller.chromium import APPS_JSON, CHROMIUM, channel_app
from controller.text import clean, clean_lines
from controller.run.driver import SandboxDriver, ScreenshotPolicy
from controller.sandbox.guest import GUEST_HOME, GUEST_PYTHON
from guest.actions import WAIT_CAP_S, WAIT_QUIET_S
from guest.localrun import AgentProcess, Xvfb

ASCII_100 = ("The quick brown fox jumps over the lazy dog; 0123456789 <>&\"'$ ~!@#%^*()_+{}|:? "
             "Pack my box with five")[:100]
UNICODE_100 = ("café naïve – 日本語のテキスト 😀 Ωμέγα straße "
               "Привет мир ✓ ünïcödé — «quotes» 東京 ¿qué? ") * 2
UNICODE_100 = UNICODE_100[:100]
TARGET_P50_MS = 20.0
TARGET_RATIO = 10.0
TARGET_SETTLED_MS = 150.0
TARGET_PATH_MS = 1.5
DEFAULT_IMAGE = "desktop-sandbox:latest"
SETTLE_RULE = (f"wait settles once the X server reported no drawing for {WAIT_QUIET_S * 1000:g} ms "
               f"(DAMAGE; frame comparison only without it), capped at {WAIT_CAP_S:g} s")

#: Screenshot request of the driver's default policy (what the model is sent).
POLICY = ScreenshotPolicy()

#: Runs in the guest: ``python -c FLOOR_SCRIPT N W H [X Y]`` prints the grab+encode times (ms) of N
#: shots as a JSON list, after two unmeasured ones. Same Capture, size bound and allocator setting as
#: the agent. With X Y, each shot follows a click near (X, Y) (the driver's clicks, :func:`_click`) run by
#: the agent's own executor in this process: a step's work in the guest with no HTTP at all.
FLOOR_SCRIPT = """\
import json, os, sys, time
from guest import capture
n, w, h = (int(a) for a in sys.argv[1:4])
getattr(capture, "retain_frame_buffers", lambda: False)()
display = os.environ.get("DISPLAY", ":99")
cap = capture.Capture(display)
click = None
if len(sys.argv) > 5:
    from guest.actions import Executor
    from guest.display import DisplayConnection
    executor, (x, y) = Executor(DisplayConnection(display), cap), (int(a) for a in sys.argv[4:6])
    click = lambda i: executor.execute([{"type": "click", "x": x + i % 40, "y": y + i % 40, "button": "left"}])
out = []
for i in range(n + 2):
    t = time.perf_counter()
    if click is not None:
        click(i)
    cap.screenshot(fmt="png", max_width=w, max_height=h)
    out.append((time.perf_counter() - t) * 1000.0)
print(json.dumps(out[2:]))
"""

#: Runs at each hop of the path: ``python -c HOP_SCRIPT HOST PORT N W H X Y`` prints the times (ms) of N
#: ``POST /v1/actions?screenshot=png`` requests, each holding one click near (X, Y) (the driver's step),
#: on one kept-alive connection, as a JSON list, after two unmeasured ones. The bearer token comes from
#: ``$AGENT_TOKEN`` or else the agent's token file (never from argv, which other users can read).
HOP_SCRIPT = """\
import http.client, json, os, sys, time
host, port = sys.argv[1], int(sys.argv[2])
n, w, h, x, y = (int(a) for a in sys.argv[3:8])
token = os.environ.get("AGENT_TOKEN") or open("/run/desktop-sandbox/agent-token").read().strip()
conn = http.client.HTTPConnection(host, port, timeout=30)
headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
path = "/v1/actions?screenshot=png&max_width=%d&max_height=%d" % (w, h)
out = []
for i in range(n + 2):
    body = json.dumps({"actions": [{"type": "click", "x": x + i % 40, "y": y + i % 40, "button": "left"}]})
    t = time.perf_counter()
    conn.request("POST", path, body, headers)
    answer = conn.getresponse()
    data = answer.read()
    out.append((time.perf_counter() - t) * 1000.0)
    if answer.status != 200 or not data.startswith(b"\\x89PNG"):
        sys.exit("hop: HTTP %d" % answer.status)
print(json.dumps(out[2:]))
"""

#: Screen px of a spot on the demo page with nothing on it (a click there unfocuses the page's input).
BLANK_SPOT = (1100, 520)
DEMO_URL = "http://127.0.0.1:8080/"
PAGE_LOADED = "~/.local/share/pickup/page-loaded"
TERMINAL_ARGS = ["-T", "Terminal", "-fa", "DejaVu Sans Mono", "-fs", "11", "-e", "bash", "-c",
                 'mkdir -p ~/.cache && touch ~/.cache/terminal-ready && cd && exec env PS1="sandbox:\\w\\$ " bash --norc -i']


def measure(fn: Callable[[int], Any], iterations: int, warmup: int = 2) -> dict[str, float]:
    """Percentiles of ``iterations`` timed runs of ``fn(i)`` after ``warmup`` unmeasured ones."""
    return percentiles(interleave({0: (fn, iterations)}, warmup)[0])


def _decorate(server: Xvfb) -> list[subprocess.Popen[bytes]]:
    """Terminals with text on screen, and one running ``cat > /dev/null`` to receive typing."""
    env = dict(server.env(), LC_ALL="C.UTF-8")
    procs = []
    for i, (x, y) in enumerate([(20, 20), (420, 180), (760, 420)]):
        procs.append(subprocess.Popen(
            ["xterm", "-geometry", f"80x24+{x}+{y}", "-e", "sh", "-c",
             f"ls -la /usr/bin | head -{40 + i * 10}; sleep 100000"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    procs.append(subprocess.Popen(
        ["xterm", "-u8", "-geometry", "100x10+0+600", "-e", "sh", "-c", "stty -echo; cat > /dev/null"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def _click(i: int, x: int = 1000, y: int = 100) -> dict[str, Any]:
    """A left click near (x, y), a little further each sample, on a spot where nothing changes."""
    return {"type": "click", "x": x + i % 40, "y": y + i % 40, "button": "left"}


def _rows(samples: dict[tuple[str, str], list[float]]) -> dict[str, dict[str, Any]]:
    """``{(operation, "agent"|"baseline"): samples}`` -> ``{operation: {"agent", "baseline"?, "ratio"?}}``."""
    rows: dict[str, dict[str, Any]] = {}
    for (name, side), values in samples.items():
        rows.setdefault(name, {})[side] = percentiles(values)
    for row in rows.values():
        if "baseline" in row and "agent" in row and row["agent"]["p50"] > 0:
            row["ratio"] = round(row["baseline"]["p50"] / row["agent"]["p50"], 1)
    return rows


def run_loopback(iterations: int = 50, baseline_iterations: int = 20, type_iterations: int = 10,
                 baseline: bool = True) -> dict[str, dict[str, Any]]:
    """The loopback section (module doc): rows by operation."""
    from guest.capture import Capture, retain_frame_buffers

    retain_frame_buffers()  # the floor gets the allocator setting the agent has
    server = Xvfb(1280, 800, 24).start()
    procs = _decorate(server)
    agent = AgentProcess(server.display).start()
    client = AgentClient(agent.base_url, agent.token, timeout=60)
    capture = Capture(server.display)
    try:
        client.actions([{"type": "wait"}])
        focus = {"type": "click", "x": 300, "y": 660, "button": "left"}  # the typing terminal
        driver = SandboxDriver(client, POLICY)
        driver.capture()
        with_baseline = baseline and shutil.which("xdotool") and shutil.which("import")
        env = server.env()

        def run(argv: list[str]) -> bytes:
            return subprocess.run(argv, env=env, check=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL).stdout

        def xclick(i: int) -> None:
            c = _click(i)
            run(["xdotool", "mousemove", str(c["x"]), str(c["y"]), "click", "1"])

        def settled_step(i: int) -> None:
            driver.plan_calls([1])  # a computer_call of one click, as the run's hooks plan it
            driver.click(_click(i))
            driver.screenshot()

        cases: dict[tuple[str, str], tuple[Callable[[int], Any], int]] = {
            ("floor: grab+encode png, in process", "agent"): (
                lambda i: capture.screenshot(fmt="png", max_width=POLICY.max_width, max_height=POLICY.max_height),
                iterations),
            ("click+screenshot png", "agent"): (
                lambda i: (client.actions([_click(i)]), client.screenshot("png")), iterations),
            ("click+screenshot jpeg", "agent"): (
                lambda i: (client.actions([_click(i)]), client.screenshot("jpeg")), iterations),
            ("screenshot png", "agent"): (lambda i: client.screenshot("png"), iterations),
            ("wait (idle screen)", "agent"): (lambda i: client.actions([{"type": "wait"}]), iterations),
            ("settled step (driver)", "agent"): (settled_step, iterations),
        }
        if with_baseline:
            cases[("click+screenshot png", "baseline")] = (
                lambda i: (xclick(i), run(["import", "-window", "root", "png:-"])), baseline_iterations)
            cases[("click+screenshot jpeg", "baseline")] = (
                lambda i: (xclick(i), run(["import", "-window", "root", "jpeg:-"])), baseline_iterations)
            cases[("screenshot png", "baseline")] = (
                lambda i: run(["import", "-window", "root", "png:-"]), baseline_iterations)
        samples = interleave(cases)

        client.actions([focus])  # typing goes to the terminal under the pointer from here on
        typing: dict[tuple[str, str], tuple[Callable[[int], Any], int]] = {
            ("type 100 ascii", "agent"): (lambda i: client.actions([{"type": "type", "text": ASCII_100}]), iterations),
            ("type 100 unicode", "agent"): (
                lambda i: client.actions([{"type": "type", "text": UNICODE_100}]), iterations),
        }
        if with_baseline:
            typing[("type 100 ascii", "baseline")] = (lambda i: run(["xdotool", "type", "--", ASCII_100]),
                                                      type_iterations)
            typing[("type 100 unicode", "baseline")] = (lambda i: run(["xdotool", "type", "--", UNICODE_100]),
                                                        type_iterations)
        samples.update(interleave(typing))
        return _rows(samples)
    finally:
        capture.close()
        client.close()
        agent.stop()
        for p in procs:
            p.kill()
            p.wait()
        server.stop()


def _docker_unavailable(image: str) -> str | None:
    """Why the Docker section cannot run here (no engine, no image), or None."""
    try:
        import docker
        import docker.errors

        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine here
        return f"no Docker engine ({' '.join(str(exc).split())[:160]})"
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return f"image {image} missing (build it with `make desktop`)"
    except Exception as exc:  # noqa: BLE001
        return f"cannot inspect image {image} ({' '.join(str(exc).split())[:160]})"
    return None


def _guest_floor(sandbox: Any, n: int, click: tuple[int, int] | None = None) -> list[float]:
    """``n`` in-guest grab+encode times (ms), from :data:`FLOOR_SCRIPT` run in the guest; each after a
    click near ``click`` (screen px) when given."""
    argv = [GUEST_PYTHON, "-c", FLOOR_SCRIPT, str(n), str(POLICY.max_width), str(POLICY.max_height)]
    argv += [str(v) for v in click] if click else []
    result = sandbox.exec_in_guest(argv, timeout=120)
    if result.exit_code != 0:
        raise RuntimeError(f"in-guest floor script failed: {clean_lines(result.stderr.decode('utf-8', 'replace'), 400)}")
    return [float(v) for v in json.loads(result.stdout)]


def _ready(agent: AgentClient, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            agent.read_file(path)
            return
        except Exception:  # noqa: BLE001 - not there yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear within {timeout:g} s") from None
            time.sleep(0.5)  # poll interval of a condition wait (the file appearing), bounded by the deadline


def _unavailable(backend: str, image: str | None) -> tuple[str | None, Any]:
    """Why the sandbox section cannot run here on ``backend`` (no engine, QEMU or image), and the
    backend's options when it can."""
    if backend == "docker":
        why = _docker_unavailable(image or DEFAULT_IMAGE)
        if why:
            return why, None
    from controller.sandbox.registry import get_backend

    try:
        cls = get_backend(backend)
        options = cls.make_options(image=image if backend != "docker" or image else DEFAULT_IMAGE)
        options = cls.ensure_image(options, lambda _m: None) if backend != "docker" else options
    except Exception as exc:  # noqa: BLE001 - any failure (unknown backend, no QEMU, no image): cannot run here
        return f"{backend}: {' '.join(str(exc).split())[:200]}", None
    return None, options


def _hop(run: Callable[[list[str]], Any], host: str, port: int, n: int) -> list[float]:
    """``n`` step times (ms) of :data:`HOP_SCRIPT` run through ``run(argv)`` (an exec in a container, or a
    host process) against the agent at ``host``:``port``."""
    width, height = POLICY.max_width or 1280, POLICY.max_height or 800
    result = run(["-c", HOP_SCRIPT, host, str(port), str(n), str(width), str(height), *map(str, BLANK_SPOT)])
    code = getattr(result, "exit_code", getattr(result, "returncode", 1))
    if code != 0:
        err = result.stderr.decode("utf-8", "replace") if isinstance(result.stderr, bytes) else str(result.stderr)
        raise RuntimeError(f"hop script failed: {clean_lines(err, 400)}")
    return [float(v) for v in json.loads(result.stdout)]


def _hops(sandbox: Any, backend: str, per: int) -> dict[str, Callable[[], list[float]]]:
    """The hop rows this backend can measure: name -> a function giving ``per`` samples."""
    from urllib.parse import urlsplit

    token = sandbox.agent_token

    def host_run(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, *argv], capture_output=True, timeout=120, check=False,
                              env={"AGENT_TOKEN": token, "PATH": "/usr/bin:/bin"})

    def url_hop(url: str) -> Callable[[], list[float]]:
        parts = urlsplit(url)
        return lambda: _hop(host_run, parts.hostname or "127.0.0.1", parts.port or 80, per)

    hops: dict[str, Callable[[], list[float]]] = {}
    if backend == "docker":
        from controller.sandbox.docker import AGENT_PORT, AGENT_UID, DESKTOP_ALIAS, GATEWAY_UID

        def in_guest(argv: list[str]) -> Any:  # as the agent's user, who alone reads the token file
            return sandbox._exec(sandbox.desktop, [GUEST_PYTHON, *argv], user=f"{AGENT_UID}:{AGENT_UID}", timeout=120)

        def in_gateway(argv: list[str]) -> Any:
            return sandbox._exec(sandbox.gateway, ["env", f"AGENT_TOKEN={token}", GUEST_PYTHON, *argv],
                                 user=f"{GATEWAY_UID}:{GATEWAY_UID}", timeout=120)

        hops["hop: agent HTTP, in the guest"] = lambda: _hop(in_guest, "127.0.0.1", AGENT_PORT, per)
        hops["hop: gateway -> agent"] = lambda: _hop(in_gateway, DESKTOP_ALIAS, AGENT_PORT, per)
        if sandbox.agent.base_url != sandbox.agent_url:
            hops["hop: host -> relay"] = url_hop(sandbox.agent.base_url)
        hops["hop: host -> published port"] = url_hop(sandbox.agent_url)
    else:
        hops["hop: host -> forwarded port"] = url_hop(sandbox.agent_url)
    return hops


def run_docker(image: str, iterations: int = 50, rounds: int = 5) -> dict[str, Any]:
    """The sandbox section on Docker (module doc): see :func:`run_sandbox`."""
    return run_sandbox("docker", image, iterations, rounds)


def run_sandbox(backend: str, image: str | None, iterations: int = 50, rounds: int = 5) -> dict[str, Any]:
    """The sandbox section (module doc) on ``backend`` with ``image`` (None: the backend's default):
    ``{"backend", "image", "rows", "idle_wait_settled"}``, or ``{"skipped": why}``. Every row is sampled
    in each of ``rounds`` rounds (``iterations / rounds`` samples a round), so load spreads over all."""
    why, options = _unavailable(backend, image)
    if why:
        return {"skipped": why}
    from controller.agent_client import AgentClient
    from controller.sandbox import SandboxSpec
    from controller.sandbox.registry import get_backend

    cls = get_backend(backend)
    spec = SandboxSpec(ready_timeout=cls.default_ready_timeout)
    with cls.start(spec, options) as sandbox:
        agent = sandbox.agent
        home = GUEST_HOME
        agent.launch("terminal", TERMINAL_ARGS)
        agent.launch("browser", [DEMO_URL])
        _ready(agent, PAGE_LOADED.replace("~", home, 1), 90 * sandbox.time_scale)
        plain = SandboxDriver(agent, ScreenshotPolicy(settle=False))
        settling = SandboxDriver(agent, POLICY)
        plain.capture()
        settling.capture()
        # Unfocus the page's input (its caret would blink), then let the screen come to rest.
        # Two waits: the first returns once the click's repaint is over, the second proves the screen
        # then stays quiet (a screen still changing would run it to the cap instead).
        agent.actions([{"type": "click", "x": BLANK_SPOT[0], "y": BLANK_SPOT[1], "button": "left"},
                       {"type": "wait"}, {"type": "wait"}])
        settled = [_wait_settled(sandbox) for _ in range(3)]

        def step(driver: SandboxDriver) -> Callable[[int], Any]:
            def run(i: int) -> None:
                driver.plan_calls([1])  # a computer_call of one click, as the run's hooks plan it
                driver.click(_click(i, *BLANK_SPOT))
                driver.screenshot()
            return run

        width, height = POLICY.max_width, POLICY.max_height
        per = max(1, math.ceil(iterations / rounds))
        hops = _hops(sandbox, backend, per)
        samples: dict[tuple[str, str], list[float]] = {}
        for r in range(rounds):
            samples.setdefault(("in-guest floor: grab+encode png", "agent"), []).extend(_guest_floor(sandbox, per))
            samples.setdefault(("in-guest click+screenshot, no HTTP", "agent"), []).extend(
                _guest_floor(sandbox, per, BLANK_SPOT))
            for name, measure_hop in hops.items():
                samples.setdefault((name, "agent"), []).extend(measure_hop())
            cases = {
                ("hop: AgentClient", "agent"): (
                    lambda i: agent.actions_screenshot([_click(i, *BLANK_SPOT)], "png", max_width=width,
                                                       max_height=height), per),
                ("driver click+screenshot", "agent"): (step(plain), per),
                ("settled step (driver)", "agent"): (step(settling), per),
            }
            for key, values in interleave(cases, warmup=1 if r == 0 else 0).items():
                samples.setdefault(key, []).extend(values)
        assert isinstance(agent, AgentClient)
        return {"backend": backend, "image": image or str(getattr(options, "image", "")), "rows": _rows(samples),
                "idle_wait_settled": settled}


#: The browser tools section's page: a heading, some text and a form of about twenty controls; the
#: ``Count`` button's click changes nothing on the page (a counter in the page's script).
BROWSER_PAGE = ("<!doctype html><html><head><title>Bench form</title>"
                "<style>body { font: 15px sans-serif; margin: 24px }"
                " label { display: block; margin: 4px 0 }</style></head><body><h1>Shipping details</h1>"
                + "".join(f"<p>Paragraph {i}: the parcel leaves the depot in the morning and reaches the "
                          f"address given below before the evening; sign on delivery.</p>" for i in range(8))
                + "<form onsubmit='event.preventDefault()'>"
                + "".join(f"<label>Field {i} <input name=f{i} value='value {i}'></label>" for i in range(12))
                + "<label>Service <select><option>Standard</option><option>Express</option></select></label>"
                + "<label><input type=checkbox> Insure the parcel</label>"
                + "<label><input type=radio name=t checked> Morning</label>"
                + "<label><input type=radio name=t> Evening</label>"
                + "<label>Notes <textarea>none</textarea></label>"
                + "<button type=button onclick='window.count = (window.count || 0) + 1'>Count</button>"
                + "<button type=submit>Send</button></form></body></html>")


def _browser_unavailable() -> str | None:
    """Why the browser tools section cannot run here, or None."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"{CHROMIUM} not installed (apt-get install chromium)"
    if not shutil.which("Xvfb"):
        return "Xvfb not installed (apt-get install xvfb)"
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        return "setpriv not found (util-linux): needed to start chromium as nobody when running as root"
    if not APPS_JSON.is_file():
        return f"{APPS_JSON} not found (run from a checkout)"
    return None


def _serve_page(body: bytes) -> Any:
    """An HTTP server of ``body`` (text/html) on 127.0.0.1 (a free port), serving on a daemon thread."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_browser(iterations: int = 30) -> dict[str, Any]:
    """The browser tools section (module doc): ``{"screen", "page", "rows", "members", "ratio"}`` (rows
    and members: name -> percentiles, ms; ratio: browser step p50 / computer settled step p50), or
    ``{"skipped": why}``."""
    why = _browser_unavailable()
    if why:
        return {"skipped": why}
    import tempfile
    from contextlib import ExitStack

    from openai.lib.browser import BrowserToolset
    from openai.types.responses import ResponseFunctionToolCall

    from controller.run.browser_driver import GuestBrowserDriver
    from guest.cdp import wait_until

    with ExitStack() as stack:  # torn down in reverse: client, agent (and its chromium), page server, Xvfb
        top = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ds-bench-browser-",
                                                                   ignore_cleanup_errors=True)))
        server = Xvfb(1280, 800, 24).start()
        stack.callback(server.stop)
        page = _serve_page(BROWSER_PAGE.encode())
        stack.callback(page.server_close)
        stack.callback(page.shutdown)
        url = f"http://127.0.0.1:{page.server_address[1]}/"
        env = {k: v for k, v in server.env().items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
        apps = channel_app(top)
        agent = AgentProcess(server.display, apps=apps, env=dict(env, HOME=str(top)), cwd=str(top)).start()
        stack.callback(agent.stop)
        client = stack.enter_context(AgentClient(agent.base_url, agent.token, timeout=60))
        client.launch("chromium", [url])
        browser = GuestBrowserDriver(client)
        if not wait_until(lambda: any(t["title"] == "Bench form" for t in browser.state()["tabs"]), 30, 0.1):
            raise RuntimeError("the agent's chromium did not show the bench page")
        toolset = BrowserToolset(browser, members=["read_page", "click", "screenshot"], confirm=lambda c: True,
                                 url_policy=lambda c, u: True)
        calls = iter(range(1, 1 << 30))

        def execute(member: str, **arguments: Any) -> dict[str, Any]:
            out = toolset.execute(ResponseFunctionToolCall(
                type="function_call", call_id=f"call_bench_{next(calls)}", name="browser_" + member,
                arguments=json.dumps({"tab_id": None, **arguments})))
            payload = json.loads(out["output"][0]["text"])
            if not payload["ok"]:
                raise RuntimeError(f"browser_{member} failed: {clean(str(payload.get('error')), 200)}")
            return payload

        def count_ref(report: dict[str, Any]) -> str:
            return next(e["ref"] for e in report["elements"] if e["label"] == "Count")

        execute("click", target=count_ref(execute("read_page", filter="all")["result"]))
        box, view = browser.last.target, browser.last.viewport
        if not box or not view:
            raise RuntimeError("the browser click reported no box or viewport")
        spot = (int(view["x"] + box["x"] + box["width"] / 2), int(view["y"] + box["y"] + box["height"] / 2))
        plain = SandboxDriver(client, ScreenshotPolicy(settle=False))
        settling = SandboxDriver(client, POLICY)
        plain.capture()
        settling.capture()
        client.actions([{"type": "wait"}])
        members: dict[str, list[float]] = {"read_page": [], "click": [], "screenshot": []}
        rounds = {"n": 0}

        def browser_step(i: int) -> None:
            t0 = time.perf_counter()
            report = execute("read_page", filter="all")["result"]
            t1 = time.perf_counter()
            execute("click", target=count_ref(report))
            t2 = time.perf_counter()
            execute("screenshot")
            t3 = time.perf_counter()
            rounds["n"] += 1
            if rounds["n"] > 1:  # the first step is interleave's warm-up round
                for member, seconds in (("read_page", t1 - t0), ("click", t2 - t1), ("screenshot", t3 - t2)):
                    members[member].append(seconds * 1000.0)

        def driver_step(i: int) -> None:
            report = browser.read_page({"tab_id": None, "filter": "all"})
            browser.click({"tab_id": None, "target": count_ref(report)})
            browser.screenshot({"tab_id": None})

        def computer_step(driver: SandboxDriver) -> Callable[[int], Any]:
            def run(i: int) -> None:
                driver.plan_calls([1])  # a computer_call of one click, as the run's hooks plan it
                driver.click({"type": "click", "x": spot[0], "y": spot[1], "button": "left"})
                driver.screenshot()
            return run

        cases: dict[tuple[str, str], tuple[Callable[[int], Any], int]] = {
            ("browser step (BrowserToolset)", "agent"): (browser_step, iterations),
            ("browser step (driver only)", "agent"): (driver_step, iterations),
            ("computer step (settled)", "agent"): (computer_step(settling), iterations),
            ("computer click+screenshot (no settle)", "agent"): (computer_step(plain), iterations),
        }
        rows = _rows(interleave(cases))
        browser_p50, computer_p50 = _p50(rows, "browser step (BrowserToolset)"), _p50(rows, "computer step (settled)")
        ratio = round(browser_p50 / computer_p50, 2) if browser_p50 and computer_p50 else None
        return {"screen": "1280x800x24", "page": f"{len(BROWSER_PAGE)} bytes, button at screen {spot}",
                "rows": rows, "members": {name: percentiles(v) for name, v in members.items()}, "ratio": ratio}


def browser_lines(section: dict[str, Any]) -> list[str]:
    """The browser tools section as plain text lines."""
    if "skipped" in section:
        return [f"browser tools: skipped ({clean(section['skipped'], 400)})"]
    lines = ["browser tools: GuestBrowserDriver beside SandboxDriver on one page in the agent's chromium, "
             f"local agent on a private Xvfb {section['screen']} ({section['page']})",
             f"{'operation':40} {'p50':>8} {'p95':>8} {'n':>4}"]
    for name, row in section["rows"].items():
        a = row["agent"]
        lines.append(f"{name:40} {a['p50']:>8.2f} {a['p95']:>8.2f} {a['n']:>4}")
    for name, a in section["members"].items():
        lines.append(f"{'  browser ' + name + ' (BrowserToolset)':40} {a['p50']:>8.2f} {a['p95']:>8.2f} {a['n']:>4}")
    ratio = section.get("ratio")
    lines.append(f"browser / computer step (p50): {ratio:.2f}x" if ratio is not None else "browser / computer step: -")
    return lines


def _wait_settled(sandbox: Any) -> bool | None:
    """The ``settled`` answer of one ``wait`` (the agent client reports only ``executed``)."""
    import httpx

    resp = httpx.post(sandbox.agent_url + "/v1/actions", json={"actions": [{"type": "wait"}]},
                      headers={"Authorization": f"Bearer {sandbox.agent_token}"}, timeout=30)
    resp.raise_for_status()
    return resp.json().get("settled")


def _p50(rows: dict[str, dict[str, Any]], name: str) -> float | None:
    row = rows.get(name)
    return row["agent"]["p50"] if row and "agent" in row else None


def run_bench(iterations: int = 50, baseline_iterations: int = 20, type_iterations: int = 10,
              baseline: bool = True, image: str | None = DEFAULT_IMAGE,
              console_iterations: int | None = 30, backend: str | None = "docker",
              browser_iterations: int | None = None) -> dict[str, Any]:
    """Every section (module doc; ``backend`` None skips the sandbox one, ``console_iterations`` None the
    console, ``browser_iterations`` None the browser tools; ``image`` None: the backend's default);
    returns the report dict."""
    results = run_loopback(iterations, baseline_iterations, type_iterations, baseline)
    sandbox = run_sandbox(backend, image, iterations) if backend else {"skipped": "--no-docker"}
    console = run_console(console_iterations) if console_iterations else {"skipped": "--no-console"}
    browser = run_browser(browser_iterations) if browser_iterations else {"skipped": "no --browser"}
    derived: dict[str, float] = {}
    checks: dict[str, bool] = {}
    png = results["click+screenshot png"]
    checks[f"loopback click+screenshot png p50 <= {TARGET_P50_MS:g} ms"] = png["agent"]["p50"] <= TARGET_P50_MS
    if "ratio" in png:
        checks[f"loopback click+screenshot png >= {TARGET_RATIO:g}x baseline"] = png["ratio"] >= TARGET_RATIO
    settled = _p50(results, "settled step (driver)")
    shot = _p50(results, "click+screenshot png")
    if settled is not None and shot is not None:
        derived["loopback settle cost per step (ms)"] = round(settled - shot, 2)
        checks[f"loopback settled step p50 < {TARGET_SETTLED_MS:g} ms (idle screen)"] = settled < TARGET_SETTLED_MS
    if "rows" in sandbox:
        name = sandbox["backend"]
        rows = sandbox["rows"]
        floor = _p50(rows, "in-guest floor: grab+encode png")
        step = _p50(rows, "driver click+screenshot")
        settled = _p50(rows, "settled step (driver)")
        in_guest = _p50(rows, "in-guest click+screenshot, no HTTP")
        assert floor is not None and step is not None and settled is not None and in_guest is not None
        if floor > 0:
            for row in rows.values():
                row["x_floor"] = round(row["agent"]["p50"] / floor, 2)
        previous = in_guest
        for row_name, row in rows.items():  # each hop's cost: its p50 less the one before it on the path
            if row_name.startswith("hop: ") or row_name == "driver click+screenshot":
                row["adds"] = round(row["agent"]["p50"] - previous, 2)
                previous = row["agent"]["p50"]
        derived[f"{name} settle cost per step (ms)"] = round(settled - step, 2)
        derived[f"{name} path cost per step (ms)"] = round(step - in_guest, 2)
        checks[f"{name} driver click+screenshot p50 <= in-guest click+screenshot (no HTTP) p50 + "
               f"{TARGET_PATH_MS:g} ms"] = step <= in_guest + TARGET_PATH_MS
        checks[f"{name} settled step p50 < {TARGET_SETTLED_MS:g} ms (idle screen)"] = settled < TARGET_SETTLED_MS
        checks[f"{name} idle-screen waits settled"] = all(v is True for v in sandbox["idle_wait_settled"])
    checks.update(console_checks(console))
    return {"screen": "1280x800x24", "iterations": iterations, "settle_rule": SETTLE_RULE,
            "results": results, "docker": sandbox, "console": console, "browser": browser, "derived": derived,
            "checks": checks}


def _fmt(value: float | None, width: int) -> str:
    return f"{value:>{width}.2f}" if value is not None else f"{'-':>{width}}"


def render(report: dict[str, Any]) -> str:
    """The report as plain text: one table per section, the derived figures and the checks."""
    head = (f"{'operation':36} {'p50':>8} {'p95':>8} {'n':>4} {'baseline p50':>13} {'baseline p95':>13} "
            f"{'ratio':>7}")
    lines = [f"desktop-sandbox bench — {report['screen']}, {report['iterations']} iterations, samples interleaved",
             f"settle rule: {report['settle_rule']}", "",
             "loopback: agent on 127.0.0.1, private Xvfb with terminals", head]
    for name, row in report["results"].items():
        a, b = row["agent"], row.get("baseline")
        lines.append(f"{name:36} {a['p50']:>8.2f} {a['p95']:>8.2f} {a['n']:>4} "
                     f"{_fmt(b['p50'] if b else None, 13)} {_fmt(b['p95'] if b else None, 13)} "
                     f"{(str(row['ratio']) + 'x') if 'ratio' in row else '-':>7}")
    lines.append("")
    docker = report["docker"]
    if "skipped" in docker:
        lines.append(f"docker sandbox: skipped ({clean(docker['skipped'], 400)})")
    else:
        lines.append(f"{docker.get('backend', 'docker')} sandbox {docker['image']}: {_path(docker)}, demo page, "
                     "idle screen")
        lines.append(f"{'operation':36} {'p50':>8} {'p95':>8} {'n':>4} {'x floor':>8} {'adds':>8}")
        for name, row in docker["rows"].items():
            a = row["agent"]
            lines.append(f"{name:36} {a['p50']:>8.2f} {a['p95']:>8.2f} {a['n']:>4} "
                         f"{(str(row['x_floor']) + 'x') if 'x_floor' in row else '-':>8} {_fmt(row.get('adds'), 8)}")
    if "console" in report:
        lines += ["", *console_lines(report["console"])]
    if "browser" in report:
        lines += ["", *browser_lines(report["browser"])]
    for name, value in report["derived"].items():
        lines.append(f"{name}: {value:.2f}")
    lines.append("times in ms; p50 median, p95 nearest rank; ratio = baseline p50 / agent p50; "
                 "x floor = p50 / in-guest floor p50; adds = p50 less the p50 of the hop before it")
    for check, ok in report["checks"].items():
        lines.append(f"{'PASS' if ok else 'FAIL'}  {check}")
    return "\n".join(lines)


def _path(section: dict[str, Any]) -> str:
    """The route the section measured, in words."""
    if section.get("backend", "docker") == "docker":
        return "driver -> AgentClient -> relay -> agent"
    return "driver -> AgentClient -> forwarded port -> agent"


def _print(report: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(render(report))
        return
    console = Console(width=max(110, Console().width))
    console.print(f"settle rule: {report['settle_rule']}", highlight=False)
    table = Table(title=f"loopback — agent on 127.0.0.1, private Xvfb {report['screen']}, samples interleaved")
    for col in ("operation", "p50 ms", "p95 ms", "n", "baseline p50 ms", "baseline p95 ms", "ratio"):
        table.add_column(col, justify="left" if col == "operation" else "right", no_wrap=True)
    for name, row in report["results"].items():
        a, b = row["agent"], row.get("baseline")
        table.add_row(name, f"{a['p50']:.2f}", f"{a['p95']:.2f}", str(a["n"]), f"{b['p50']:.2f}" if b else "-",
                      f"{b['p95']:.2f}" if b else "-", f"{row['ratio']:.1f}x" if "ratio" in row else "-")
    console.print(table)
    docker = report["docker"]
    if "skipped" in docker:
        console.print(f"docker sandbox: skipped ({clean(docker['skipped'], 400)})", markup=False, emoji=False,
                      highlight=False)
    else:
        table = Table(title=f"{docker.get('backend', 'docker')} sandbox {docker['image']} — {_path(docker)}, "
                            "demo page, idle screen")
        for col in ("operation", "p50 ms", "p95 ms", "n", "x floor", "adds ms"):
            table.add_column(col, justify="left" if col == "operation" else "right", no_wrap=True)
        for name, row in docker["rows"].items():
            a = row["agent"]
            table.add_row(name, f"{a['p50']:.2f}", f"{a['p95']:.2f}", str(a["n"]),
                          f"{row['x_floor']:.2f}x" if "x_floor" in row else "-",
                          f"{row['adds']:.2f}" if "adds" in row else "-")
        console.print(table)
    for line in console_lines(report["console"]) if "console" in report else ():
        console.print(line, markup=False, emoji=False, highlight=False)
    for line in browser_lines(report["browser"]) if "browser" in report else ():
        console.print(line, markup=False, emoji=False, highlight=False)
    for name, value in report["derived"].items():
        console.print(f"{name}: {value:.2f}", highlight=False)
    console.print("p50 median, p95 nearest rank; ratio = baseline p50 / agent p50; x floor = p50 / in-guest floor "
                  "p50; adds = p50 less the p50 of the hop before it on the path", highlight=False)
    for check, ok in report["checks"].items():
        console.print(f"[{'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/] {check}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv``, run the benchmark, print the tables; returns the report dict."""
    parser = argparse.ArgumentParser(prog="python -m controller.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--baseline-iterations", type=int, default=20)
    parser.add_argument("--type-iterations", type=int, default=10, help="baseline xdotool type runs")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="guest image of the Docker section")
    parser.add_argument("--no-docker", action="store_true", help="skip the sandbox section")
    parser.add_argument("--backend", default="docker", help="backend of the sandbox section (docker | vm)")
    parser.add_argument("--console-iterations", type=int, default=30, help="action-to-pixels samples in the console")
    parser.add_argument("--no-console", action="store_true", help="skip the web console section")
    parser.add_argument("--browser", action="store_true",
                        help="also the browser tools section: a browser step beside a computer step")
    parser.add_argument("--browser-iterations", type=int, default=30, help="samples of each browser tools case")
    parser.add_argument("--json", help="also write the report to this file")
    ns = parser.parse_args(argv)
    report = run_bench(ns.iterations, ns.baseline_iterations, ns.type_iterations, baseline=not ns.no_baseline,
                       image=ns.image if ns.backend == "docker" or ns.image != DEFAULT_IMAGE else None,
                       console_iterations=None if ns.no_console else ns.console_iterations,
                       backend=None if ns.no_docker else ns.backend,
                       browser_iterations=ns.browser_iterations if ns.browser else None)
    _print(report)
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return report


if __name__ == "__main__":
    report = main()
    sys.exit(0 if all(report["checks"].values()) else 1)
