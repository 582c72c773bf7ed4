"""The agent's HTTP surface without a working display: token, files, launch, 503, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from controller.agent_client import AgentClient, AgentError
from guest.localrun import AgentProcess

NO_DISPLAY = ":9871"  # nothing listens there: the agent must still serve, answering 503


@pytest.fixture(scope="module")
def files_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("root")
    (root / "hello.txt").write_text("hello\n")
    (root / "big.bin").write_bytes(b"x" * 5000)
    (root / "sub").mkdir()
    (root / "sub" / "inner.txt").write_text("inner")
    (root / "escape").symlink_to("/etc/passwd")
    (root / "inside-link").symlink_to(root / "sub" / "inner.txt")
    return root


@pytest.fixture(scope="module")
def agent(files_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("launch")
    writer = "import sys, json; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))"
    apps = {"writer": [sys.executable, "-c", writer], "sleeper": [sys.executable, "-c", "import time; time.sleep(0.2)"]}
    proc = AgentProcess(NO_DISPLAY, apps=apps, files_roots=[str(files_root)],
                        extra_args=["--max-file-bytes", "4096"]).start()
    proc.out = out
    yield proc
    proc.stop()


ENDPOINTS = [("GET", "/v1/display"), ("POST", "/v1/actions"), ("GET", "/v1/screenshot"),
             ("POST", "/v1/release"), ("GET", "/v1/files?path=/tmp"), ("POST", "/v1/launch")]


@pytest.mark.parametrize("method,path", ENDPOINTS)
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Basic abc", "Bearer", "bearer  x"])
def test_every_endpoint_but_livez_needs_the_token(agent, method, path, header):
    headers = {"Authorization": header} if header else {}
    resp = httpx.request(method, agent.base_url + path, headers=headers, json={"actions": []})
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "unauthorized"


def test_livez_needs_no_token(agent):
    resp = httpx.get(agent.base_url + "/livez")
    assert resp.status_code == 200 and resp.json() == {"status": "ok"}


@pytest.mark.parametrize("call", ["display", "screenshot", "actions", "release"])
def test_display_unavailable_is_503_and_the_agent_keeps_serving(agent, client, call):
    with pytest.raises(AgentError) as err:
        {"display": client.display, "screenshot": client.screenshot, "release": client.release,
         "actions": lambda: client.actions([{"type": "move", "x": 1, "y": 1}])}[call]()
    assert err.value.status == 503 and err.value.code == "display_unavailable"
    assert client.livez() and agent.proc.poll() is None


def test_read_file(client, files_root):
    assert client.read_file(str(files_root / "hello.txt")) == b"hello\n"
    assert client.read_file(str(files_root / "sub" / ".." / "hello.txt")) == b"hello\n"
    assert client.read_file(str(files_root / "inside-link")) == b"inner"


@pytest.mark.parametrize("path,status,code", [
    ("", 400, "bad_path"),
    ("relative/hello.txt", 400, "bad_path"),
    ("/etc/passwd", 403, "forbidden"),
    ("{root}/../../../etc/passwd", 403, "forbidden"),
    ("{root}/escape", 403, "forbidden"),
    ("/etc/does-not-exist", 403, "forbidden"),
    ("{root}/missing.txt", 404, "not_found"),
    ("{root}/big.bin", 413, "too_large"),
    ("{root}/sub", 400, "bad_path"),
])
def test_read_file_refusals(client, files_root, path, status, code):
    with pytest.raises(AgentError) as err:
        client.read_file(path.format(root=files_root))
    assert (err.value.status, err.value.code) == (status, code)


def test_launch_appends_args_as_argv_without_a_shell(client, agent, tmp_path):
    out = tmp_path / "argv.json"
    args = [str(out), "$(touch pwned)", "; touch pwned2", "a b", "-n", "--flag", "`id`", "*"]
    pid = client.launch("writer", args)
    assert pid > 0
    from tests.conformance.harness import poll

    poll(lambda: out.exists() and out.read_text(), 10, what="the launched app to write")
    assert json.loads(out.read_text()) == args[1:]
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_launch_unknown_app_is_400(client):
    with pytest.raises(AgentError) as err:
        client.launch("bash", ["-c", "id"])
    assert (err.value.status, err.value.code) == (400, "unknown_app")


@pytest.mark.parametrize("body", [{"app": "writer", "args": "x"}, {"app": "writer", "args": [1]}, {"args": []}, [],
                                  {"app": "writer", "args": {}}, {"app": "writer", "args": False},
                                  {"app": "writer", "args": 0}, {"app": "writer", "args": ""}])
def test_launch_bad_body_is_400(agent, body):
    resp = httpx.post(agent.base_url + "/v1/launch", json=body, headers={"Authorization": f"Bearer {agent.token}"})
    assert resp.status_code == 400


def test_launched_children_are_reaped(client):
    pid = client.launch("sleeper")

    def state() -> str | None:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("State:"):
                    return line.split()[1]
        except FileNotFoundError:
            return None
        return None

    deadline = time.monotonic() + 10
    while state() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state() is None, f"child {pid} left as state {state()} (zombie if Z)"


@pytest.mark.parametrize("body,code", [(b"not json", "invalid_request"), (b'{"nope": 1}', "invalid_action"),
                                       (b'{"actions": 5}', "invalid_action"), (b'[{"actions": []}]', "invalid_action")])
def test_actions_body_must_be_valid(agent, body, code):
    # The body is judged before the display is needed: 400, although this agent's X server is gone (503).
    resp = httpx.post(agent.base_url + "/v1/actions", content=body,
                      headers={"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"})
    assert (resp.status_code, resp.json()["error"]["code"]) == (400, code), resp.text


def test_serve_refuses_an_empty_token_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("\n")
    proc = subprocess.run([sys.executable, "-m", "guest", "serve", "--display", NO_DISPLAY, "--bind",
                           "127.0.0.1:1", "--token-file", str(token)], capture_output=True, text=True,
                          timeout=30, cwd=Path(__file__).resolve().parents[2], env=dict(os.environ))
    assert proc.returncode == 2 and "empty" in proc.stderr


#: Bodies no JSON library writes on purpose: nesting deeper than any request needs (up to and past the
#: parser's own recursion limit), and lone UTF-16 surrogates (valid JSON escapes that are not text and
#: cannot be encoded as UTF-8).
HOSTILE_BODIES = [
    ("/v1/actions", b'{"actions":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    *[("/v1/actions", b'{"actions":[{"type":"keypress","keys":' + b"[" * n + b"]" * n + b"}]}")
      for n in (40, 900, 960, 990)],
    ("/v1/launch", b'{"app":"writer","args":' + b"[" * 980 + b"]" * 980 + b"}"),
    ("/v1/actions", b'{"actions":[{"type":"keypress","keys":["ab\\ud800"]}]}'),
    ("/v1/actions", b'{"actions":[{"type":"keypress","keys":["\\udfff"]}]}'),
    ("/v1/actions", b'{"actions":[{"type":"type","text":"a\\ud83d"}]}'),
    ("/v1/launch", b'{"app":"writer","args":["\\ud800"]}'),
    ("/v1/launch", b'{"app":"\\ud800"}'),
]


@pytest.mark.parametrize("path,body", HOSTILE_BODIES)
def test_hostile_json_is_a_structured_400_and_the_connection_stays_usable(agent, path, body):
    with httpx.Client(base_url=agent.base_url, headers={"Authorization": f"Bearer {agent.token}"}) as http:
        resp = http.post(path, content=body, headers={"Content-Type": "application/json"})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "invalid_request"
        # Same keep-alive connection: the agent answered normally and did not drop it.
        assert http.get("/livez").json() == {"status": "ok"}
        assert http.post("/v1/launch", json={"app": "nope"}).json()["error"]["code"] == "unknown_app"


def test_an_oversized_body_is_413_before_it_is_buffered(agent):
    from guest.app import MAX_BODY_BYTES

    headers = {"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"}
    resp = httpx.post(agent.base_url + "/v1/actions", headers=headers,
                      content=b'{"actions":[{"type":"type","text":"' + b"a" * MAX_BODY_BYTES + b'"}]}')
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "too_large"

    def chunks():  # no Content-Length: the limit holds for a streamed body too
        yield b'{"actions":[{"type":"type","text":"'
        for _ in range(MAX_BODY_BYTES // (1 << 20) + 1):
            yield b"a" * (1 << 20)
        yield b'"}]}'

    resp = httpx.post(agent.base_url + "/v1/launch", headers=headers, content=chunks())
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "too_large"
    assert httpx.get(agent.base_url + "/livez").status_code == 200


@pytest.mark.parametrize("query", ["crop=1_0,0,10,10", "crop=%EF%BC%91,0,10,10", "max_width=1_000",
                                   "quality=%D9%A5%D9%A0", "crop=0x1,0,10,10"])
def test_screenshot_numbers_are_plain_decimal_integers(agent, query):
    # int() would read "1_0" as 10 and Unicode digits as numbers; the API takes ASCII decimals only.
    resp = httpx.get(f"{agent.base_url}/v1/screenshot?{query}", headers={"Authorization": f"Bearer {agent.token}"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_request"
