"""The whole conformance suite against the agent in a Docker sandbox, through the adapters' path.

docs/adapting.md ("What the host side must provide") tells an adapter to prove its environment with
``python -m pytest tests/conformance --conformance-target=...``; this runs exactly that command with
``--conformance-desktop=tests.docker._conformance:conformance_desktop`` (the suite observes the guest's
X server through the sandbox) in a child pytest, and reads its JUnit report: every test must pass, and
only the harness's own tests, which need the display reachable from the test process, may skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Modules of tests/conformance that may skip against a sandbox, and why.
MAY_SKIP = {"tests.conformance.test_harness": "needs the display reachable from the test"}
#: The child run's limit in seconds (it takes about a minute on an idle 2-core machine).
SUITE_TIMEOUT_S = 900


def _collected(args: list[str]) -> int:
    """How many tests ``pytest --collect-only`` finds for ``args`` (no sandbox is started)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return sum(1 for line in out.stdout.splitlines() if "::" in line)


def test_the_suite_passes_against_the_agent_in_a_sandbox(docker_client, desktop_image, test_labels, tmp_path):
    report = tmp_path / "junit.xml"
    args = ["tests/conformance", "--conformance-desktop=tests.docker._conformance:conformance_desktop"]
    env = dict(os.environ, DESKTOP_SANDBOX_IMAGE=desktop_image, DESKTOP_SANDBOX_TEST_LABELS=json.dumps(test_labels))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S,
    )
    assert report.exists(), f"the suite wrote no report (exit {run.returncode}):\n{run.stdout[-4000:]}{run.stderr[-4000:]}"
    cases = ET.parse(report).getroot().iter("testcase")
    failed, skipped, passed = [], [], 0
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = next(iter(case), None)
        if outcome is None or outcome.tag in ("system-out", "system-err", "properties"):
            passed += 1
        elif outcome.tag == "skipped":
            skipped.append((case.get("classname"), name, outcome.get("message", "")))
        else:
            failed.append(f"{name}: {(outcome.get('message') or '')[:500]}")
    assert not failed, "failed against the sandbox:\n" + "\n".join(failed) + "\n" + run.stdout[-3000:]
    unexpected = [(n, m) for module, n, m in skipped if MAY_SKIP.get(module, "\0") not in m]
    assert not unexpected, f"skipped against the sandbox: {unexpected}"
    assert run.returncode == 0, run.stdout[-3000:]
    # Every collected test ran: nothing was silently deselected or lost.
    assert passed + len(skipped) == _collected(args) and passed > 0, (passed, skipped)
