"""Fixtures for the video tests: a private desktop whose screen never stops changing (Xvfb, the real agent,
an xterm printing random text: every frame differs and compresses badly, so the caps are reached), the
Docker fixtures of tests/docker for the pickup run, and what reads a video back (PyAV)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.harness import poll
from tests.docker.conftest import _remove_test_leftovers, desktop_image, docker_client, test_labels  # noqa: F401
from tests.require import require_commands

NOISE = ["xterm", "-geometry", "200x60+0+0", "-e", "sh", "-c", "while :; do head -c 4000 /dev/urandom | base64; done"]
"""An app whose window is random text scrolling as fast as the terminal draws it."""


class NoisyDesk:
    """Xvfb 1280x800, the agent (its one app :data:`NOISE`, launched) and a client of it."""

    def __init__(self) -> None:
        from controller.agent_client import AgentClient
        from guest.localrun import AgentProcess, Xvfb

        self.xvfb = Xvfb(1280, 800, 24).start()
        self.agent = AgentProcess(self.xvfb.display, apps={"noise": NOISE}).start()
        self.client = AgentClient(self.agent.base_url, self.agent.token, timeout=20)
        self.client.launch("noise", [])
        first = self.client.screenshot(format="jpeg").data
        poll(lambda: self.client.screenshot(format="jpeg").data != first, timeout=20, what="the noise app drawing")

    def close(self) -> None:
        self.client.close()
        self.agent.stop()
        self.xvfb.stop()


@pytest.fixture(scope="module")
def noisy() -> Iterator[NoisyDesk]:
    require_commands("X", "Xvfb", "xterm", install="apt-get install xvfb xterm")
    desk = NoisyDesk()
    yield desk
    desk.close()


@pytest.fixture(scope="module")
def readable_dir() -> Iterator[Path]:
    """A folder every user may read (Debian's chromium runs as ``nobody`` under root and opens pages from it)."""
    top = Path(tempfile.mkdtemp(prefix="ds-video-"))
    os.chmod(top, 0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def decode(path: Path) -> dict[str, Any]:
    """The video at ``path`` read back with PyAV: ``codec``, ``frames`` (count), ``pts_ms`` (each frame's
    time, ms), ``size`` (w, h), ``duration_s`` (the container's), ``images`` (every frame as RGB Pillow)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        return {"codec": stream.codec_context.name, "frames": len(frames),
                "pts_ms": [float(f.pts * f.time_base * 1000) for f in frames],
                "size": (frames[0].width, frames[0].height) if frames else None,
                "duration_s": container.duration / 1_000_000 if container.duration else None,
                "images": [f.to_image() for f in frames]}


def small_webm(path: Path, frames: int = 3) -> bytes:
    """A real WebM (VP9, 64x48, ``frames`` frames half a second apart) written at ``path``; returns its bytes."""
    import fractions

    import av
    from PIL import Image

    with av.open(str(path), mode="w", format="webm") as container:
        stream = container.add_stream("libvpx-vp9", rate=2)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.time_base = stream.codec_context.time_base = fractions.Fraction(1, 1000)
        for n in range(frames):
            frame = av.VideoFrame.from_image(Image.new("RGB", (64, 48), (40 * n, 90, 160)))
            frame.pts, frame.time_base = n * 500, fractions.Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path.read_bytes()
