"""The warm pool and its claim socket against hostile or broken callers, on real containers: a claimer
that goes away before it takes its sandbox over leaves nothing behind; only a sandbox's claimer hands
it back; a policy the gateway refuses costs no pool sandbox; a claimer talks only to a keeper of its own
user."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller.sandbox import LABEL_SANDBOX, SandboxSpec
from controller.sandbox.docker import DockerOptions, DockerSandbox
from controller.sandbox.owner import claimed_owner, forget_claim, owner_id
from controller.sandbox.pool import Template, WarmPool
from controller.sandbox.pool_keeper import PoolKeeper, claim_from

REPO = Path(__file__).resolve().parents[2]


def containers_of(docker_client, sandbox_id: str) -> list[str]:
    return [c.name for c in docker_client.containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}={sandbox_id}"})]


def gone_within(docker_client, sandbox_id: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while containers_of(docker_client, sandbox_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)  # poll until the engine has removed them
    return True


def raw_claim(path: Path, spec: dict) -> socket.socket:
    """A claim sent by hand on a fresh connection (the answer not read)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    conn.connect(str(path))
    conn.sendall((json.dumps({"spec": spec, "owner_id": owner_id(), "owner": "hostile:1"}) + "\n").encode())
    return conn


def read_answer(conn: socket.socket) -> dict:
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, "the keeper closed the connection without an answer"
        data += chunk
    return json.loads(data.split(b"\n", 1)[0])


@pytest.fixture(scope="module")
def kept(docker_client, desktop_image, test_labels):
    """A pool of 2 at the default template with its keeper, filled before the first test."""
    options = DockerOptions(image=desktop_image, extra_labels=test_labels)
    with WarmPool(DockerSandbox, options, [Template()], 2) as pool, PoolKeeper(pool) as keeper:
        assert pool.wait_ready(timeout=240), pool.stats
        yield pool, keeper


def test_a_policy_the_gateway_refuses_costs_no_pool_sandbox(kept):
    pool, keeper = kept
    removed, ready = pool.stats.removed, pool.ready_count()
    with raw_claim(keeper.path, {"policy": {"mode": "sometimes"}}) as conn:
        answer = read_answer(conn)
    assert answer["source"] == "cold" and answer["reason"] == "bad_request", answer
    assert "mode" in answer["error"]
    assert (pool.stats.removed, pool.ready_count()) == (removed, ready), "pool sandboxes were spent on it"
    sandbox, reason = pool.take(SandboxSpec(policy={"mode": "allowlist", "allow": ["ftp://x.test"]}))
    assert sandbox is None and reason == "bad_policy"
    assert (pool.stats.removed, pool.ready_count()) == (removed, ready)


def test_a_claimer_gone_before_taking_its_sandbox_over_leaves_nothing(kept, docker_client):
    """One claimer closes as soon as its answer is there, unread (it gave up waiting); another reads the
    answer, tokens and all, and closes without saying it took the sandbox. Neither sandbox is recorded
    as theirs; the keeper removes both."""
    pool, keeper = kept
    assert pool.wait_ready(2, timeout=240)
    with pool._cond:
        ids = [sb.id for sb in pool._ready[Template()]]
    assert len(ids) == 2
    try:
        with raw_claim(keeper.path, {}) as unread:
            assert select.select([unread], [], [], 30)[0], "no answer"
        with raw_claim(keeper.path, {}) as reader:
            answer = read_answer(reader)
            assert answer["source"] == "pool" and answer["facts"]["id"] == ids[1], answer
            assert claimed_owner(ids[1]) is None, "recorded as the claimer's before it took the sandbox over"
        for sandbox_id in ids:
            assert gone_within(docker_client, sandbox_id, 30), f"{sandbox_id} was left behind"
            assert claimed_owner(sandbox_id) is None
    finally:
        for sandbox_id in ids:
            if containers_of(docker_client, sandbox_id):
                DockerSandbox.remove(sandbox_id)
                forget_claim(sandbox_id)


def test_only_its_claimer_hands_a_sandbox_back(kept, docker_client):
    pool, keeper = kept
    assert pool.wait_ready(1, timeout=240)
    claimed = claim_from(keeper.path, SandboxSpec(), DockerSandbox, start_cold=lambda: pytest.fail("cold"))
    try:
        for forged in ({"release": claimed.id}, {"release": claimed.id, "token": "x" * 32}):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
                other.settimeout(10)
                other.connect(str(keeper.path))
                other.sendall((json.dumps(forged) + "\n").encode())
                assert read_answer(other) == {"released": False}, forged
        assert claimed.agent.display()["width"] == 1280, "another process removed the claimer's sandbox"
    finally:
        claimed.close()
    assert gone_within(docker_client, claimed.id, 30)


FOREIGN_KEEPER = r"""
import os, socket, sys
os.setgid(65534)
os.setuid(65534)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1]); server.listen(1); server.settimeout(20)
print("ready", flush=True)
try:
    conn, _ = server.accept()
except OSError:
    sys.exit(0)
conn.settimeout(5)
got = conn.recv(65536)
conn.sendall(b'{"source": "cold", "reason": "spoofed"}\n')
print("request" if got else "nothing", flush=True)
"""


def test_a_claimer_talks_only_to_a_keeper_of_its_own_user():
    """A socket at the claim path served by another user (a name squatted in a shared directory) is
    not asked anything: the claimer starts a sandbox itself."""
    if os.geteuid() != 0:
        pytest.skip("needs root to serve the socket as another user")
    folder = Path(tempfile.mkdtemp(prefix="shared-"))
    folder.chmod(0o1777)
    path = folder / "claim.sock"
    foreign = subprocess.Popen([sys.executable, "-c", FOREIGN_KEEPER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert foreign.stdout.readline().strip() == "ready"
        started = SimpleNamespace()
        got = claim_from(path, SandboxSpec(), DockerSandbox, start_cold=lambda: started, timeout=5)
        assert got is started and got.provenance["reason"] == "keeper_foreign", got.provenance
    finally:
        foreign.kill()
        out, _ = foreign.communicate(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
    assert "request" not in out, "the claimer sent its claim to another user's socket"
