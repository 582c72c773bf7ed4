"""The OpenAI Agents SDK's ``SandboxAgent`` on :class:`desktop_sandbox.agents_sandbox.DesktopSandboxClient`.

One real run per module: the SDK's ``Runner`` runs a ``SandboxAgent`` whose session the client starts in a
real Docker sandbox of the guest image (deny-all), against a scripted Responses server on 127.0.0.1 that the
real ``openai`` client reaches over HTTP. The model turns run a shell command in the guest, read files with
``view_image`` (one of them a symlink out of the home), patch and add files with ``apply_patch``, flood
the output, overrun a timeout, and then call ``inspect_guest``, a function tool of this module that looks
at the guest through the controller sandbox itself (the agent's ``read_file``, ``exec_in_guest``) while the
session is live, and tries paths outside the home on the session. After the run the sandbox must be gone.

Without a Docker engine or the image the run is skipped, or fails under ``DESKTOP_SANDBOX_REQUIRE_IMAGE=1``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from controller.sandbox.guest import GUEST_HOME, GUEST_PYTHON
from tests.docker.conftest import _remove_test_leftovers, desktop_image, docker_client, test_labels  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 240.0
OUTPUT_CAP = 64 * 1024
KEY = "scripted-responses-key"


def _png_1x1() -> bytes:
    """A valid 1x1 RGB PNG (made here: the bytes the guest writes and ``view_image`` must read back)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x80\x10"))
            + chunk(b"IEND", b""))


PNG = _png_1x1()
PATCH = (
    "*** Begin Patch\n"
    "*** Update File: note.txt\n"
    "@@\n"
    "-hello-guest\n"
    "+hello-patched\n"
    "*** Add File: made/by-sdk.txt\n"
    "+made by the sdk\n"
    "*** End Patch\n"
)
SETUP = (
    "printf 'hello-guest\\n' > note.txt && "
    f"printf %s '{base64.b64encode(PNG).decode()}' | base64 -d > pixel.png && "
    "ln -s /etc/hostname escape.png && ln -s /tmp out && "
    "id -un && id -u && pwd && echo \"home=$HOME\""
)


def _call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": json.dumps(arguments), "status": "completed"}


TURNS: list[list[dict[str, Any]]] = [
    [_call("call_setup", "exec_command", cmd=SETUP, yield_time_ms=30000)],
    [_call("call_view", "view_image", path="pixel.png"),
     _call("call_view_link", "view_image", path="escape.png"),
     _call("call_view_abs", "view_image", path="/etc/hostname"),
     _call("call_flood", "exec_command", cmd="head -c 300000 /dev/zero | tr '\\0' a", yield_time_ms=30000),
     _call("call_sleep", "exec_command", cmd="sleep 31.5", yield_time_ms=1500)],
    [{"type": "custom_tool_call", "id": "ctc_patch", "call_id": "call_patch", "name": "apply_patch", "input": PATCH}],
    [_call("call_inspect", "inspect_guest")],
    [{"type": "message", "id": "msg_done", "role": "assistant", "status": "completed",
      "content": [{"type": "output_text", "text": "done", "annotations": []}]}],
]
"""The scripted model's turns, one Responses output list per request."""


class ScriptedResponses:
    """A real HTTP server on 127.0.0.1 answering ``POST /v1/responses`` with :data:`TURNS` in order, in the
    Responses API's shape. It stands in for the model (no real model can run offline); everything else in
    the run is real. It keeps each request body for the tests, and answers 401 without its key and 400
    once the script is spent."""

    def __init__(self, turns: list[list[dict[str, Any]]]) -> None:
        self.turns = turns
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = min(int(self.headers.get("Content-Length") or 0), 64 * 1024 * 1024)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.headers.get("Authorization") != f"Bearer {KEY}" or self.path != "/v1/responses":
                    return self._send(401, {"error": {"code": "invalid_api_key", "message": "no", "type": "auth"}})
                status, answer = outer.answer(body)
                self._send(status, answer)

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            index = len(self.requests)
            self.requests.append(body)
        if index >= len(self.turns):
            return 400, {"error": {"code": "script_spent", "message": "no more turns", "type": "invalid_request_error"}}
        now = time.time()
        return 200, {
            "id": f"resp_{index:04d}", "object": "response", "created_at": now, "completed_at": now,
            "status": "completed", "model": body.get("model", "scripted"), "output": self.turns[index],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": body.get("tools", []), "error": None,
            "incomplete_details": None, "instructions": None, "metadata": {}, "temperature": None, "top_p": None,
            "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 20},
        }

    def __enter__(self) -> "ScriptedResponses":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def _outputs(body: dict[str, Any]) -> dict[str, str]:
    """``call_id`` -> the JSON text of its output item, over a request's input."""
    found = {}
    for item in body.get("input", []):
        if isinstance(item, dict) and str(item.get("type", "")).endswith("_call_output"):
            output = item.get("output")
            found[item["call_id"]] = output if isinstance(output, str) else json.dumps(output)
    return found


async def _inspect(client: Any, findings: dict[str, Any]) -> str:
    """What ``inspect_guest`` does: look at the live guest through the controller sandbox, and try paths
    outside the home on the SDK session."""
    from desktop_sandbox.agents_sandbox import GuestPathError

    (session,) = client.sessions
    sb = session.sandbox
    findings["sandbox_id"] = sb.id
    findings["note"] = await asyncio.to_thread(sb.agent.read_file, f"{GUEST_HOME}/note.txt")
    findings["made"] = await asyncio.to_thread(sb.agent.read_file, f"{GUEST_HOME}/made/by-sdk.txt")
    stat = await asyncio.to_thread(sb.exec_in_guest, ["stat", "-c", "%u %U", f"{GUEST_HOME}/note.txt",
                                                      f"{GUEST_HOME}/made/by-sdk.txt"], timeout=10)
    findings["owners"] = stat.stdout.decode().split("\n")[:2]
    sleepers = await asyncio.to_thread(sb.exec_in_guest, [GUEST_PYTHON, "-c", (
        "import glob\n"
        "n = 0\n"
        "for f in glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n"
        "        n += open(f, 'rb').read().split(b'\\0')[:2] == [b'sleep', b'31.5']\n"
        "    except OSError:\n"
        "        pass\n"
        "print(n)\n")], timeout=10)
    findings["sleepers"] = sleepers.stdout.decode().strip()
    refused: dict[str, str] = {}
    attempts: dict[str, Callable[[], Any]] = {
        "read /etc/passwd": lambda: session.read(Path("/etc/passwd")),
        "read ../../etc/passwd": lambda: session.read(Path("../../etc/passwd")),
        "read escape.png": lambda: session.read(Path("escape.png")),
        "write /home/elsewhere.txt": lambda: session.write(Path("/home/elsewhere.txt"), io.BytesIO(b"x")),
        "write out/escaped.txt": lambda: session.write(Path("out/escaped.txt"), io.BytesIO(b"x")),
        "mkdir out/escaped-dir": lambda: session.mkdir(Path("out/escaped-dir")),
    }
    for what, attempt in attempts.items():
        try:
            await attempt()
            refused[what] = "accepted"
        except GuestPathError as exc:
            refused[what] = str(exc)
    findings["refused"] = refused
    leaked = await asyncio.to_thread(sb.exec_in_guest, ["sh", "-c", "ls -d /tmp/escaped.txt /tmp/escaped-dir "
                                                       "/home/elsewhere.txt 2>/dev/null; true"], timeout=10)
    findings["leaked"] = leaked.stdout.decode()
    findings["borrowed"] = await _borrow(sb, session)
    return "inspected"


async def _borrow(sb: Any, owner: Any) -> dict[str, Any]:
    """A second client given the live sandbox: its session shares the guest, survives a serialize and
    resume, and deleting it leaves the sandbox running (the owner's session still answers)."""
    from desktop_sandbox.agents_sandbox import DesktopSandboxClient, DesktopSandboxClientOptions

    borrower = DesktopSandboxClient(sandbox=sb)
    session = await borrower.create(options=DesktopSandboxClientOptions(max_output_bytes=4096))
    await session.start()
    seen: dict[str, Any] = {"owned": session._inner.owned}
    seen["note"] = (await session.exec("cat note.txt")).stdout
    payload = json.loads(json.dumps(borrower.serialize_session_state(session.state)))
    resumed = await borrower.resume(borrower.deserialize_session_state(payload))
    seen["resumed_same_sandbox"] = resumed._inner.sandbox is sb
    await borrower.delete(resumed)
    await borrower.delete(session)
    seen["owner_after"] = (await owner.exec("echo alive")).stdout
    return seen


@pytest.fixture(scope="module")
def run(desktop_image: str, test_labels: dict[str, str]) -> Iterator[dict[str, Any]]:  # noqa: F811
    """The module's one run (one sandbox): its model requests, final output, what ``inspect_guest`` saw,
    the sandbox's id, the client, and seconds taken."""
    from agents import RunConfig, Runner, function_tool
    from agents.models.openai_responses import OpenAIResponsesModel
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from openai import AsyncOpenAI

    from desktop_sandbox.agents_sandbox import DesktopSandboxClient, DesktopSandboxClientOptions

    client = DesktopSandboxClient()
    findings: dict[str, Any] = {}

    @function_tool(name_override="inspect_guest")
    async def inspect_guest() -> str:
        """Look at the guest."""
        return await _inspect(client, findings)

    async def go(server: ScriptedResponses) -> Any:
        model = OpenAIResponsesModel(model="scripted-sandbox",
                                     openai_client=AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0))
        agent = SandboxAgent(name="guest-worker", instructions="Work in the guest.", model=model, tools=[inspect_guest])
        options = DesktopSandboxClientOptions(image=desktop_image, labels=dict(test_labels), max_output_bytes=OUTPUT_CAP)
        config = RunConfig(sandbox=SandboxRunConfig(client=client, options=options), tracing_disabled=True)
        return await asyncio.wait_for(Runner.run(agent, "Set up the files.", run_config=config), RUN_TIMEOUT_S)

    with ScriptedResponses(TURNS) as server:
        start = time.monotonic()
        result = asyncio.run(go(server))
        took = time.monotonic() - start
    yield {"requests": server.requests, "final": result.final_output, "findings": findings,
           "sandbox_id": findings.get("sandbox_id"), "client": client, "seconds": took}


def test_run_used_every_tool_and_finished(run: dict[str, Any]) -> None:
    """The run went through every scripted turn and the SDK declared the sandbox tools to the model."""
    assert run["final"] == "done"
    assert len(run["requests"]) == len(TURNS)
    names = {tool.get("name") for tool in run["requests"][0]["tools"]}
    assert {"exec_command", "view_image", "apply_patch", "inspect_guest"} <= names, names
    assert run["seconds"] < RUN_TIMEOUT_S


def test_shell_runs_in_the_guest_as_the_desktop_user(run: dict[str, Any]) -> None:
    """``exec_command`` ran in the guest: as ``sandbox`` (uid 1000, not root), in the home, HOME set."""
    output = _outputs(run["requests"][1])["call_setup"]
    assert "Process exited with code 0" in output
    assert f"sandbox\n1000\n{GUEST_HOME}\nhome={GUEST_HOME}" in output
    assert run["findings"]["owners"] == ["1000 sandbox", "1000 sandbox"]


def test_file_read_through_the_sdk_is_the_guest_file(run: dict[str, Any]) -> None:
    """``view_image`` read the PNG the guest command wrote, byte for byte."""
    output = _outputs(run["requests"][2])["call_view"]
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert url in output


def test_apply_patch_wrote_in_the_guest(run: dict[str, Any]) -> None:
    """``apply_patch`` read, patched and wrote ``note.txt`` and made a file in a new folder, in the guest
    (read back with the guest agent's own ``read_file``)."""
    assert run["findings"]["note"] == b"hello-patched\n"
    assert run["findings"]["made"] == b"made by the sdk"  # an added file has no final newline


def test_paths_outside_the_home_are_refused(run: dict[str, Any]) -> None:
    """Outside the home, as written or through a symlink, a read or write is refused with a message that
    says so, and nothing is made outside."""
    refused = run["findings"]["refused"]
    for what, message in refused.items():
        assert f"outside the guest home {GUEST_HOME}" in message, (what, message)
    assert "resolves to /etc/hostname" in refused["read escape.png"]
    assert "resolves to /tmp/escaped.txt" in refused["write out/escaped.txt"]
    assert run["findings"]["leaked"] == ""
    outputs = _outputs(run["requests"][2])
    assert "GuestPathError" in outputs["call_view_link"]
    assert "Invalid path" in outputs["call_view_abs"]
    assert "data:image" not in outputs["call_view_link"] + outputs["call_view_abs"]


def test_a_given_sandbox_is_shared_and_kept(run: dict[str, Any]) -> None:
    """A client given a started sandbox runs its sessions there, resumes them there, and leaves it running."""
    borrowed = run["findings"]["borrowed"]
    assert borrowed["owned"] is False
    assert borrowed["note"] == b"hello-patched\n"
    assert borrowed["resumed_same_sandbox"] is True
    assert borrowed["owner_after"] == b"alive\n"


def test_output_is_capped_and_calls_are_bounded(run: dict[str, Any]) -> None:
    """A flood of output comes back cut at the cap with a note; a command past its timeout is reported as
    timed out and killed in the guest."""
    outputs = _outputs(run["requests"][2])
    flood = outputs["call_flood"]
    assert f"[desktop-sandbox: output cut at {OUTPUT_CAP} bytes]" in flood
    assert OUTPUT_CAP <= flood.count("a") < OUTPUT_CAP + 2000
    assert "timed out after 1.500 seconds" in outputs["call_sleep"]
    assert run["findings"]["sleepers"] == "0"


def test_sandbox_is_removed_after_the_run(run: dict[str, Any], docker_client) -> None:  # noqa: F811
    """The session's own sandbox is gone once the run ends: no container or network of it is left."""
    from controller.sandbox import LABEL_SANDBOX
    from controller.sandbox.registry import get_backend

    sandbox_id = run["sandbox_id"]
    assert sandbox_id
    assert sandbox_id not in get_backend("docker").list_all()
    assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}) == []
    assert docker_client.networks.list(filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"}) == []
    assert run["client"].sessions == []


def test_manifest_outside_the_home_is_refused_before_a_sandbox_starts() -> None:
    """A workspace root or a path grant outside the home is refused at ``create``, before anything starts."""
    from agents.sandbox import Manifest, SandboxPathGrant

    from desktop_sandbox.agents_sandbox import DesktopSandboxClient, GuestPathError

    client = DesktopSandboxClient(backend="no-such-backend")  # a start would fail with KeyError
    with pytest.raises(GuestPathError, match=f"outside the guest home {GUEST_HOME}"):
        asyncio.run(client.create(manifest=Manifest(root="/etc")))
    with pytest.raises(GuestPathError, match="/home/sandbox/../other"):
        asyncio.run(client.create(manifest=Manifest(root="/home/sandbox/../other")))
    with pytest.raises(GuestPathError):
        asyncio.run(client.create(manifest=Manifest(extra_path_grants=(SandboxPathGrant(path="/var/lib"),))))


def test_importing_the_package_does_not_import_the_sdk() -> None:
    """``import desktop_sandbox`` leaves the Agents SDK unimported."""
    code = "import sys, desktop_sandbox; print('agents' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_module_without_the_sdk_names_the_extra() -> None:
    """Without ``openai-agents`` the client module's ImportError names ``desktop-sandbox[agents]``."""
    code = ("import sys\n"
            "sys.modules['agents'] = None\n"
            "try:\n"
            "    import desktop_sandbox.agents_sandbox\n"
            "except ImportError as exc:\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "desktop-sandbox[agents]" in out.stdout
