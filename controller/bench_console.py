"""Benchmark of the web console (:mod:`controller.console`): how long an action sent from the console's
page takes to show in the page's live image, and what the live view costs the controller's CPU.

Run by :mod:`controller.bench` (``--no-console`` skips it): :func:`run_console` returns the section, or
``{"skipped": why}`` without Xvfb, Debian's chromium (:data:`controller.chromium.CHROMIUM`) or Playwright.

**Setup**, all private to this process: an Xvfb 1280x800x24; the agent as a real subprocess
(:class:`guest.localrun.AgentProcess`); a window (:data:`TOGGLE_SCRIPT`, python-xlib in a subprocess)
whose square turns black or white on every button or key press; a :class:`LiveRun` attached to an
:class:`AgentClient` of that agent and taken over (state ``human``: a thread waits in its checkpoint as
the model loop does); a :class:`ConsoleServer` serving it; Debian's chromium driven by Playwright,
logged in through the one-time URL, on the run's page, whose ``<img>`` shows the frames its socket
brings at 5 a second (static/screen.js).

**Action to pixels** (ms): in the page, ``performance.now()`` from sending a click on the square as the
page sends input (``fetch`` POST ``/runs/{id}/input``, the page's CSRF token) to the first animation
frame whose ``<img>``, drawn into a canvas, shows the square's new colour. Before each sample the page
waits until its image shows the square's present colour, then a random delay under one frame period,
so actions land at every phase of the stream's frame clock as a person's do. The floor, sampled
alternately with it: the same click sent straight to the agent from Python, then the screenshot a
console frame is (JPEG, quality 60, at most 1280 wide) polled until it shows the change. ``x floor`` =
console p50 / floor p50. Also the input POST's round trip as the page sees it.

**CPU of the live view**: the controller is this process; its CPU time (``time.process_time``, every
thread, the console's included) over windows of ``window_s`` seconds with :data:`TABS` tabs of the run's
page open in one browser, in turn: none showing the live screen (every tab hidden: the page asks for no
frame), one tab shown (one viewer), all of them shown (:data:`TABS` viewers). A tab is hidden or shown
as the browser does when it goes to the background (:data:`VISIBILITY_JS`: headless tabs are never
hidden on their own). Reported, medians over the windows: CPU % of one core of each, the live view's
share (less the idle windows'), CPU ms per frame served, the frames per second the run's one grab loop
served and each shown tab received (its page's count), and the agent process's CPU % (the guest's side
of the same frames); for one viewer at the top level, for :data:`TABS` under ``tabs``.
"""

from __future__ import annotations

import io
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from controller import chromium
from controller.agent_client import AgentClient
from controller.bench_sampling import percentiles
from controller.chromium import launch as launch_chromium

SCREEN = (1280, 800)
FPS = 5.0
"""Frame rate of the live view (what screen.js asks for)."""
FRAME = {"format": "jpeg", "quality": 60, "max_width": 1280}
"""The screenshot a console frame is (:meth:`LiveRun.frame`'s defaults); the floor polls the same."""
SQUARE = (560, 320, 160)
"""x, y, side (screen px) of the square that changes colour."""
CLICK = (SQUARE[0] + 24, SQUARE[1] + 24)
SPOT = (SQUARE[0] + 96, SQUARE[1] + 96)
"""Centre of the 8x8 block whose colour is read: inside the square, away from the pointer."""
TARGET_P50_MS = 150.0
MIN_FPS_RATIO = 0.9
"""The browser must receive at least this share of the frames per second it asked for."""
TABS = 5
"""Tabs of the run's page in the CPU windows (all of them viewers in the last kind of window)."""
MAX_SHARED_RATIO = 1.5
"""With :data:`TABS` viewers the run's grab loop may serve at most this many times one viewer's frames."""
SAMPLE_TIMEOUT_S = 5.0
RUN_ID = "bench-console"

#: ``python -c TOGGLE_SCRIPT X Y SIDE``: a window over the screen, white, with a square at (X, Y) that
#: turns black or white on each button or key press; prints ``ready`` once it is on screen.
TOGGLE_SCRIPT = """\
import sys
from Xlib import X, display
x, y, side = (int(a) for a in sys.argv[1:4])
dpy = display.Display()
screen = dpy.screen()
win = screen.root.create_window(0, 0, screen.width_in_pixels, screen.height_in_pixels, 0, screen.root_depth,
                                X.InputOutput, X.CopyFromParent, background_pixel=screen.white_pixel,
                                override_redirect=True,
                                event_mask=X.ButtonPressMask | X.KeyPressMask | X.ExposureMask | X.StructureNotifyMask)
win.map()
gcs = [win.create_gc(foreground=screen.white_pixel), win.create_gc(foreground=screen.black_pixel)]
dark = 0
while True:
    ev = dpy.next_event()
    if ev.type in (X.ButtonPress, X.KeyPress):
        dark ^= 1
    win.fill_rectangle(gcs[dark], x, y, side, side)
    dpy.sync()
    if ev.type == X.MapNotify:
        print("ready", flush=True)
"""

#: One console sample, in the page (see the module docstring); resolves to ``{ms, post_ms}``.
SAMPLE_JS = """async ({action, spot, dark, jitterMs, timeoutMs}) => {
  const img = document.getElementById("screen-img");
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 8;
  const ctx = canvas.getContext("2d", {willReadFrequently: true});
  const shows = (wantDark) => {
    if (!img.naturalWidth) return false;
    ctx.drawImage(img, spot[0] - 4, spot[1] - 4, 8, 8, 0, 0, 8, 8);
    const d = ctx.getImageData(0, 0, 8, 8).data;
    let sum = 0;
    for (let i = 0; i < d.length; i += 4) sum += d[i] + d[i + 1] + d[i + 2];
    const level = sum / (d.length / 4 * 3);
    return wantDark ? level < 64 : level > 192;
  };
  const until = async (wantDark, deadline) => {
    for (;;) {
      const now = performance.now();
      if (shows(wantDark)) return now;
      if (now > deadline) throw new Error("the live image did not show the square " + (wantDark ? "dark" : "light"));
      // poll interval: once per displayed frame, the finest the page can see its image change
      await new Promise((resolve) => requestAnimationFrame(resolve));
    }
  };
  await until(!dark, performance.now() + timeoutMs);
  // a random phase against the stream's frame clock (frame-rate pacing, not a wait for a condition)
  await new Promise((resolve) => setTimeout(resolve, jitterMs));
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const t0 = performance.now();
  const posted = fetch(location.pathname + "/input", {
    method: "POST", credentials: "same-origin", cache: "no-store",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf}, body: JSON.stringify(action),
  }).then(async (resp) => {
    if (resp.status !== 202) throw new Error("POST input answered " + resp.status + ": " + (await resp.text()));
    return performance.now() - t0;
  });
  const [seen, postMs] = await Promise.all([until(dark, t0 + timeoutMs), posted]);
  return {ms: seen - t0, post_ms: postMs};
}"""

#: Hide (true) or show (false) a tab as the browser does when it goes to the background or comes back:
#: the page's ``visibilitychange`` handler then stops or resumes asking for frames (static/screen.js).
VISIBILITY_JS = """(hidden) => {
  Object.defineProperty(document, "visibilityState", {value: hidden ? "hidden" : "visible", configurable: true});
  document.dispatchEvent(new Event("visibilitychange"));
}"""


def unavailable() -> str | None:
    """Why the console section cannot run here, or None."""
    if shutil.which("Xvfb") is None:
        return "Xvfb not installed (apt-get install xvfb)"
    return chromium.unavailable()


def _shows(jpeg: bytes, dark: bool) -> bool:
    """Whether a frame (JPEG of the whole screen) shows the square dark (or light)."""
    from PIL import Image, ImageStat

    image = Image.open(io.BytesIO(jpeg))
    image.draft("L", (image.width // 8, image.height // 8))  # decode at 1/8 scale: all a colour test needs
    image = image.convert("L")
    x, y = SPOT[0] * image.width // SCREEN[0], SPOT[1] * image.height // SCREEN[1]
    level = ImageStat.Stat(image.crop((x - 1, y - 1, x + 1, y + 1))).mean[0]
    return level < 64 if dark else level > 192


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_toggle(env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", TOGGLE_SCRIPT, *(str(v) for v in SQUARE)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    if not select.select([proc.stdout], [], [], 15)[0] or proc.stdout.readline().strip() != b"ready":
        proc.kill()
        proc.wait()
        raise RuntimeError("the toggle window did not come up")
    return proc


def _latency(page: Any, agent: AgentClient, iterations: int, seed: int) -> dict[str, list[float]]:
    """Console samples and floor samples, alternately (one unmeasured pair first)."""
    rng = random.Random(seed)
    click = {"type": "click", "x": CLICK[0], "y": CLICK[1], "button": "left"}
    out: dict[str, list[float]] = {"console": [], "floor": [], "input_post": []}
    dark = False
    for i in range(iterations + 1):
        dark = not dark
        got = page.evaluate(SAMPLE_JS, {"action": click, "spot": list(SPOT), "dark": dark,
                                        "jitterMs": rng.uniform(0, 1000 / FPS), "timeoutMs": SAMPLE_TIMEOUT_S * 1000})
        dark = not dark
        start = time.perf_counter()
        agent.actions([click])
        while not _shows(agent.screenshot(**FRAME).data, dark):
            # no pause: each poll is a capture and an encode in the agent, the floor's own granularity
            if time.perf_counter() - start > SAMPLE_TIMEOUT_S:
                raise RuntimeError(f"the agent's screenshot did not show the square {'dark' if dark else 'light'}")
        floor = (time.perf_counter() - start) * 1000.0
        if i:
            out["console"].append(got["ms"])
            out["input_post"].append(got["post_ms"])
            out["floor"].append(floor)
    return out


def _cpu(tabs: list[Any], served: list[int], agent_pid: int, rounds: int, window_s: float) -> dict[str, Any]:
    """The live view's CPU (module docstring): windows with no tab, one tab and every tab shown, in turn,
    ``rounds`` each; ``tabs``: the run's page in each tab."""
    kinds = {"idle": 0, "one": 1, "tabs": len(tabs)}
    windows: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    frames = "() => window.DSScreen.frames()"  # the frames a tab has shown (static/screen.js)
    for _ in range(rounds):
        for kind, shown in kinds.items():
            for n, tab in enumerate(tabs):
                tab.evaluate(VISIBILITY_JS, n >= shown)
            counts = [tab.evaluate(frames) for tab in tabs[:shown]]
            for tab, count in zip(tabs, counts):  # each shown tab has its frames coming again
                tab.wait_for_function("(n) => window.DSScreen.frames() > n", arg=count,
                                      timeout=SAMPLE_TIMEOUT_S * 1000)
            if not shown:
                _quiet(served)
            counts = [tab.evaluate(frames) for tab in tabs[:shown]]
            s0, c0, a0, w0 = len(served), time.process_time(), _cpu_s(agent_pid), time.perf_counter()
            time.sleep(window_s)  # the measuring window itself: CPU time is read over a span of wall time
            w1, c1, a1, s1 = time.perf_counter(), time.process_time(), _cpu_s(agent_pid), len(served)
            got = [tab.evaluate(frames) - count for tab, count in zip(tabs, counts)]
            windows[kind].append({"wall": w1 - w0, "cpu": c1 - c0, "agent": a1 - a0, "served": s1 - s0,
                                  "rate": statistics.median(got) / (w1 - w0) if got else 0.0})
    for tab in tabs:
        tab.evaluate(VISIBILITY_JS, False)
    med = statistics.median
    idle_pct = med([w["cpu"] / w["wall"] * 100 for w in windows["idle"]])

    def figures(kind: str) -> dict[str, Any]:
        per_frame = [(v["cpu"] - i["cpu"] / i["wall"] * v["wall"]) * 1000 / v["served"]
                     for i, v in zip(windows["idle"], windows[kind]) if v["served"]]
        pct = med([w["cpu"] / w["wall"] * 100 for w in windows[kind]])
        return {"viewer_cpu_pct": round(pct, 2), "live_view_cpu_pct": round(pct - idle_pct, 2),
                "cpu_ms_per_frame": round(med(per_frame), 2) if per_frame else None,
                "browser_fps": round(med([w["rate"] for w in windows[kind]]), 2),
                "served_fps": round(med([w["served"] / w["wall"] for w in windows[kind]]), 2),
                "agent_cpu_pct": round(med([w["agent"] / w["wall"] * 100 for w in windows[kind]]), 2)}

    return {"fps": FPS, "window_s": window_s, "rounds": rounds, "idle_cpu_pct": round(idle_pct, 2),
            **figures("one"), "idle_served": sum(w["served"] for w in windows["idle"]),
            "tabs": {"count": len(tabs), **figures("tabs")}}


def _quiet(served: list[int]) -> None:
    """Return once no frame was served for two frame periods (the hidden tabs ask for none)."""
    deadline = time.monotonic() + SAMPLE_TIMEOUT_S
    seen = -1
    while seen != len(served):
        if time.monotonic() > deadline:
            raise RuntimeError("frames were still served with every tab hidden")
        seen = len(served)
        time.sleep(2 / FPS)  # poll interval: two frame periods, so a live stream serves one in between


def _live_run(root: Path, agent: AgentClient, stack: ExitStack) -> tuple[Any, list[int]]:
    """A LiveRun on ``agent``, taken over (a thread waits in its checkpoint, as the model loop does),
    and the list its frames' sizes go to as they are served."""
    from controller.run.live import LiveRun
    from controller.run.registry import ApprovalRegistry

    (root / RUN_ID).mkdir()
    stop = threading.Event()
    live = LiveRun(RUN_ID, root / RUN_ID, ApprovalRegistry(None))
    live.attach(agent, SCREEN, cancel=lambda by: stop.set(), record_human=lambda entry: None, task_name=RUN_ID)
    stack.callback(live.finish, "cancelled")
    stack.callback(stop.set)
    served: list[int] = []
    frame = live.frame

    def counted(*args: Any, **kwargs: Any) -> bytes:
        data = frame(*args, **kwargs)
        served.append(len(data))
        return data

    live.frame = counted  # type: ignore[method-assign]  # the frames served, for the CPU figures
    live.take_over(by="bench")
    threading.Thread(target=live.checkpoint, args=(stop.is_set,), kwargs={"screenshot": True}, daemon=True).start()
    seq, deadline = 0, time.monotonic() + SAMPLE_TIMEOUT_S
    while live.state != "human" and time.monotonic() < deadline:
        for event in live.events_after(seq, 1.0):  # woken by the state change itself
            seq = event["seq"]
    if live.state != "human":
        raise RuntimeError(f"the run never reached state human (it is {live.state})")
    return live, served


def run_console(iterations: int = 30, rounds: int = 3, window_s: float = 4.0, seed: int = 1) -> dict[str, Any]:
    """The console section (module docstring): ``{"screen", "latency", "cpu"}`` or ``{"skipped": why}``."""
    why = unavailable()
    if why:
        return {"skipped": why}
    from playwright.sync_api import sync_playwright

    from controller.console.server import ConsoleServer
    from guest.localrun import AgentProcess, Xvfb, terminate

    with ExitStack() as stack:  # torn down in reverse: browser, console, run, agent, window, Xvfb
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ds-bench-console-")))
        xvfb = Xvfb(*SCREEN, 24).start()
        stack.callback(xvfb.stop)
        stack.callback(terminate, _start_toggle(xvfb.env()))
        agent = AgentProcess(xvfb.display).start()
        stack.callback(agent.stop)
        live_agent, floor_agent = (stack.enter_context(AgentClient(agent.base_url, agent.token, timeout=30))
                                   for _ in range(2))
        live, served = _live_run(root, live_agent, stack)
        server = ConsoleServer(root).start()
        stack.callback(server.stop)
        server.add_run(live)
        browser = launch_chromium(stack.enter_context(sync_playwright()))
        stack.callback(browser.close)
        context = browser.new_context(viewport={"width": 1600, "height": 1100})  # its tabs share the login
        page = context.new_page()
        page.goto(server.url)  # lands on the runs list, the console's base path + "/"
        page.goto(page.url.rstrip("/") + f"/runs/{RUN_ID}")
        page.wait_for_function("() => document.getElementById('state').textContent === 'human'"
                               " && document.getElementById('screen-img').naturalWidth > 0")
        samples = _latency(page, floor_agent, iterations, seed)
        tabs = [page]
        for _ in range(TABS - 1):  # more tabs of the same browser (its session cookie)
            tabs.append(context.new_page())
            tabs[-1].goto(page.url)
        cpu = _cpu(tabs, served, agent.proc.pid, rounds, window_s)
    rows = {name: percentiles(values) for name, values in samples.items()}
    x_floor = round(rows["console"]["p50"] / rows["floor"]["p50"], 2) if rows["floor"]["p50"] > 0 else None
    cpu["frame_kib"] = round(statistics.median(served) / 1024, 1)
    return {"screen": f"{SCREEN[0]}x{SCREEN[1]}x24", "latency": {**rows, "x_floor": x_floor}, "cpu": cpu}


def checks(section: dict[str, Any]) -> dict[str, bool]:
    """The section's PASS/FAIL lines (none when it was skipped)."""
    if "latency" not in section:
        return {}
    cpu, p50 = section["cpu"], section["latency"]["console"]["p50"]
    tabs = cpu["tabs"]
    return {
        f"console action-to-pixels p50 < {TARGET_P50_MS:g} ms (measured {p50:.1f} ms)": p50 < TARGET_P50_MS,
        (f"console live view at {cpu['fps']:g} fps: browser received {cpu['browser_fps']:g} fps "
         f"(>= {MIN_FPS_RATIO * cpu['fps']:g}); controller CPU {cpu['live_view_cpu_pct']:g}% of one core, "
         f"{cpu['cpu_ms_per_frame']} ms per frame; {tabs['count']} tabs: {tabs['browser_fps']:g} fps each, "
         f"{tabs['served_fps']:g} frames/s grabbed (<= {MAX_SHARED_RATIO:g} x one tab's {cpu['served_fps']:g}), "
         f"controller CPU {tabs['live_view_cpu_pct']:g}%"):
            cpu["browser_fps"] >= MIN_FPS_RATIO * cpu["fps"] and tabs["browser_fps"] >= MIN_FPS_RATIO * cpu["fps"]
            and tabs["served_fps"] <= MAX_SHARED_RATIO * cpu["served_fps"],
    }


def render_lines(section: dict[str, Any]) -> list[str]:
    """The section as plain text lines (its checks are rendered with the report's)."""
    if "skipped" in section:
        return [f"web console: skipped ({section['skipped']})"]
    lat, cpu = section["latency"], section["cpu"]
    lines = [f"web console: page on 127.0.0.1, <img> of its socket's frames at {cpu['fps']:g} fps, clicks POSTed "
             f"from the page; private Xvfb {section['screen']}",
             f"{'operation':36} {'p50':>8} {'p95':>8} {'n':>4} {'x floor':>8}"]
    for key, name in (("console", "action-to-pixels (page <img>)"), ("floor", "floor: click + agent screenshot"),
                      ("input_post", "input POST round trip (page)")):
        row = lat[key]
        ratio = f"{lat['x_floor']}x" if key == "console" and lat.get("x_floor") is not None else "-"
        lines.append(f"{name:36} {row['p50']:>8.2f} {row['p95']:>8.2f} {row['n']:>4} {ratio:>8}")
    tabs = cpu["tabs"]
    lines.append(f"live view at {cpu['fps']:g} fps: controller CPU {cpu['live_view_cpu_pct']:.2f}% of one core "
                 f"(one tab shown {cpu['viewer_cpu_pct']:.2f}%, none {cpu['idle_cpu_pct']:.2f}%), "
                 f"{cpu['cpu_ms_per_frame']} ms CPU per frame ({cpu.get('frame_kib', '?')} KiB); browser received "
                 f"{cpu['browser_fps']:.2f} fps, served {cpu['served_fps']:.2f}; agent CPU "
                 f"{cpu['agent_cpu_pct']:.2f}%; median of {cpu['rounds']} x {cpu['window_s']:g} s windows each")
    lines.append(f"{tabs['count']} tabs shown: controller CPU {tabs['live_view_cpu_pct']:.2f}% of one core "
                 f"({tabs['viewer_cpu_pct']:.2f}% in all), {tabs['cpu_ms_per_frame']} ms CPU per frame grabbed; each "
                 f"tab received {tabs['browser_fps']:.2f} fps, the run's one grab loop served "
                 f"{tabs['served_fps']:.2f}; "
                 f"agent CPU {tabs['agent_cpu_pct']:.2f}%")
    return lines
