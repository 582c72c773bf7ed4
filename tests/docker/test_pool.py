"""The warm pool on real containers: a claim is a pool sandbox made the claimer's (fresh agent token, the
task's policy in the gateway), never given twice; an empty pool or another template falls back to a
cold start, counted; closing removes what was not claimed, also a start in flight; a killed keeper's
sandboxes are reaped like any other orphan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from controller.agent_client import AgentClient, AgentError
from controller.run.record import read_entries
from controller.run.runner import RunOptions, run_task
from controller.run.tasks import load_task
from controller.sandbox import LABEL_SANDBOX, SandboxSpec
from controller.sandbox.docker import DockerOptions, DockerSandbox
from controller.sandbox.pool import LABEL_POOL, Template, WarmPool, claim_opener

from .conftest import record_ready

REPO = Path(__file__).resolve().parents[2]
ALLOW = {"mode": "allowlist", "allow": ["https://example.test"]}


def pool_containers(docker_client, key: str, labels: dict[str, str]) -> list[str]:
    filters = {"label": [f"{LABEL_POOL}={key}", *(f"{k}={v}" for k, v in labels.items())]}
    # the list alone (sparse): a full list inspects each container, which fails for one the pool removed
    # between the two calls (a start it abandoned or retried)
    return [(c.attrs.get("Names") or ["?"])[0].lstrip("/")
            for c in docker_client.containers.list(all=True, filters=filters, sparse=True)]


@pytest.fixture(scope="module")
def pool(docker_client, desktop_image, test_labels):
    """A pool of 2 at the default template (1280x800), filled before the first test."""
    options = DockerOptions(image=desktop_image, extra_labels=test_labels)
    with WarmPool(DockerSandbox, options, [Template()], 2) as made:
        assert made.wait_ready(timeout=240), made.stats
        yield made


def test_a_claim_gives_a_ready_sandbox_a_fresh_token_and_the_tasks_policy(pool, docker_client):
    waiting = list(pool._ready[Template()])
    old_tokens = {sb.id: sb.agent_token for sb in waiting}
    sandbox = pool.claim(SandboxSpec(policy=ALLOW))
    try:
        assert sandbox.id in old_tokens and sandbox.provenance["source"] == "pool"
        assert sandbox.provenance["claim_s"] < 2.0
        record_ready(f"pool claim {sandbox.id}", {"claim": sandbox.provenance["claim_s"]})
        assert sandbox.agent_token != old_tokens[sandbox.id]
        with AgentClient(sandbox.agent_url, old_tokens[sandbox.id]) as stale:
            with pytest.raises(AgentError) as refused:
                stale.display()
            assert refused.value.status == 401
        assert sandbox.agent.display()["width"] == 1280
        policy = httpx.get(sandbox.gateway_control_url + "/v1/policy", timeout=10, trust_env=False,
                           headers={"Authorization": f"Bearer {sandbox.gateway_control_token}"}).json()["policy"]
        assert (policy["mode"], policy["allow"]) == ("allowlist", ["https://example.test"])
        assert sandbox.policy_swap["policy"] == policy
        assert sandbox not in pool._ready[Template()]
    finally:
        sandbox.close()
    assert pool.wait_ready(2, timeout=240), "the pool did not refill"


def test_a_run_on_a_pool_hit_passes_and_its_record_says_so(desktop_image, test_labels, tmp_path):
    """The pickup task's template carries its apps: the pool launched them (and saw its ready files)
    before the claim, the run launches nothing and passes the same checks."""
    task = load_task(REPO / "tasks" / "pickup.toml")
    launch, ready = task.pool_apps()
    assert [app for app, _args in launch] == ["terminal", "browser"] and len(ready) == 2
    template = Template.of(task.sandbox_spec(), launch, ready)
    options = DockerOptions(image=desktop_image, extra_labels=test_labels)
    with WarmPool(DockerSandbox, options, [template], 1) as pool:
        assert pool.wait_ready(timeout=240), pool.stats
        outcome = run_task(task, claim_opener(pool), RunOptions(runs_dir=tmp_path, live=False, terminal=False))
    assert outcome.status == "passed", outcome
    entries = read_entries(outcome.record_dir / "record.jsonl")
    started = next(e for e in entries if e.type == "run_started")
    assert started.claim["source"] == "pool" and started.claim["launched"] is True
    assert started.claim["claim_s"] < 2.0
    swap = [e for e in entries if e.type == "policy"]
    assert len(swap) == 1 and swap[0].why == "claim" and swap[0].policy["mode"] == task.network.mode
    assert outcome.timings["launch_ready"] < outcome.timings["loop"]


def test_concurrent_claims_never_share_a_sandbox_and_fall_back_cold(pool, docker_client):
    assert pool.wait_ready(2, timeout=240)
    before_hits, before_cold = pool.stats.hits, pool.stats.cold
    got, errors = [], []

    def claim() -> None:
        try:
            got.append(pool.claim(SandboxSpec(policy=ALLOW)))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    try:
        assert not errors and len(got) == 3
        assert len({sb.id for sb in got}) == 3
        sources = sorted(sb.provenance["source"] for sb in got)
        assert sources == ["cold", "pool", "pool"]
        assert (pool.stats.hits - before_hits, pool.stats.cold - before_cold) == (2, 1)
        assert pool.stats.cold_reasons.get("empty", 0) >= 1
    finally:
        for sb in got:
            sb.close()


def test_another_template_is_a_cold_start_with_its_reason(pool):
    sandbox = pool.claim(SandboxSpec(screen_width=1024, screen_height=768))
    try:
        assert sandbox.provenance == {**sandbox.provenance, "source": "cold", "reason": "no_template"}
        assert sandbox.agent.display()["width"] == 1024
    finally:
        sandbox.close()


def test_closing_removes_what_was_not_claimed_and_a_start_in_flight(docker_client, desktop_image, test_labels):
    options = DockerOptions(image=desktop_image, extra_labels=test_labels)
    template = Template(1024, 768)
    made = WarmPool(DockerSandbox, options, [template], 1).start()
    deadline = time.monotonic() + 60
    while not pool_containers(docker_client, template.key(), test_labels) and time.monotonic() < deadline:
        time.sleep(0.05)  # poll until the start is in flight (its first container exists)
    assert pool_containers(docker_client, template.key(), test_labels), "the filler started nothing"
    started = time.monotonic()
    made.close()
    assert time.monotonic() - started < 60
    assert pool_containers(docker_client, template.key(), test_labels) == []
    assert made.stats.started == 0  # abandoned, not finished


KEEPER = """
import sys, time
from controller.sandbox.docker import DockerOptions, DockerSandbox
from controller.sandbox.pool import Template, WarmPool
from controller.sandbox.pool_keeper import PoolKeeper
pool = WarmPool(DockerSandbox, DockerOptions(image=sys.argv[1], extra_labels=dict([sys.argv[2].split("=")])),
                [Template(800, 600)], 1).start()
keeper = PoolKeeper(pool).start()
assert pool.wait_ready(timeout=240)
print(keeper.path, flush=True)
time.sleep(600)
"""


def test_a_claim_from_another_process_belongs_to_the_claimer(docker_client, desktop_image, test_labels):
    """A keeper in another process hands a sandbox over its socket; once the keeper is killed, its
    unclaimed sandboxes are reaped and the claimed one, whose claimer lives, is not."""
    from controller.sandbox.owner import claimed_owner
    from controller.sandbox.pool_keeper import claim_from

    template = Template(800, 600)
    label = "=".join(next(iter(test_labels.items())))
    keeper = subprocess.Popen([sys.executable, "-c", KEEPER, desktop_image, label], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    claimed = None
    try:
        path = keeper.stdout.readline().strip()
        assert path, "the keeper did not start"
        import socket as _socket

        for junk in (b"{not json\n", b'{"spec": {"screen_width": true}, "owner_id": "x", "owner": "y"}\n'):
            with _socket.socket(_socket.AF_UNIX) as raw:  # bad requests: a cold answer, the keeper goes on
                raw.settimeout(10)
                raw.connect(path)
                raw.sendall(junk)
                answer = json.loads(raw.makefile().readline())
                assert (answer["source"], answer["reason"]) == ("cold", "bad_request")
        claimed = claim_from(path, SandboxSpec(screen_width=800, screen_height=600, policy=ALLOW), DockerSandbox,
                             start_cold=lambda: pytest.fail("a cold start while the pool had one"))
        assert claimed.provenance["source"] == "pool" and claimed.provenance["claim_s"] < 2.0
        assert claimed.agent.display()["width"] == 800
        assert claimed_owner(claimed.id) is not None
    finally:
        keeper.send_signal(signal.SIGKILL)
        keeper.wait(30)
    try:
        reaped = DockerSandbox.reap_orphans()
        assert claimed.id not in reaped
        assert sorted(pool_containers(docker_client, template.key(), test_labels)) == [
            f"{claimed.id}-desktop", f"{claimed.id}-gateway"]
        assert claimed.agent.display()["width"] == 800
    finally:
        claimed.close()
    assert claimed_owner(claimed.id) is None
    assert pool_containers(docker_client, template.key(), test_labels) == []


def test_a_sandbox_handed_back_is_removed_by_its_keeper(pool, docker_client):
    from controller.sandbox.owner import claimed_owner
    from controller.sandbox.pool_keeper import PoolKeeper, claim_from, release_to

    assert pool.wait_ready(1, timeout=240)
    with PoolKeeper(pool) as keeper:
        claimed = claim_from(keeper.path, SandboxSpec(), DockerSandbox, start_cold=lambda: pytest.fail("cold"))
        assert release_to(keeper.path, "ds-00000000") is False  # only what it handed out
        started = time.monotonic()
        claimed.close()
        handed_back = time.monotonic() - started
    # the keeper waited for its removal on close
    assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}={claimed.id}"}) == []
    assert claimed_owner(claimed.id) is None
    assert handed_back < 1.0


def test_an_unreachable_keeper_means_a_cold_start(desktop_image, test_labels, tmp_path):
    from controller.sandbox.pool_keeper import claim_from

    options = DockerOptions(image=desktop_image, extra_labels=test_labels)
    spec = SandboxSpec(screen_width=800, screen_height=600)
    sandbox = claim_from(tmp_path / "nothing.sock", spec, DockerSandbox, start_cold=lambda: DockerSandbox.start(spec, options))
    try:
        assert sandbox.provenance["source"] == "cold" and sandbox.provenance["reason"] == "keeper_unreachable"
    finally:
        sandbox.close()
