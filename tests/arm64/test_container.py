"""The arm64 guest image under emulation (qemu-user-static through binfmt_misc): it is an arm64 image,
its agent answers, the conformance suite's quick modules pass against it, and the pickup exercise
passes through ``desktop-sandbox run-task --arch arm64``."""

from __future__ import annotations

import os
import subprocess
import sys

from controller.sandbox.image import EMULATION_MEM_LIMIT, EMULATION_TIME_SCALE

from .conftest import REPO, labels_json, record, run_quick_conformance

RUN_TASK_TIMEOUT_S = 1200


def test_the_image_runs_arm64_binaries_with_the_png_fast_path(docker_client, arm64_image):
    out = docker_client.containers.run(
        arm64_image, ["/opt/desktop-sandbox/bin/python", "-c",
                      "import platform; from guest import png; print(platform.machine(), png.isal_zlib is not None)"],
        entrypoint=[], remove=True, user="sandbox")
    assert out.decode().split() == ["aarch64", "True"], out


def test_the_agent_answers_under_emulation(docker_client, arm64_image, test_labels):
    from controller.sandbox import SandboxSpec
    from controller.sandbox.docker import DockerOptions, DockerSandbox

    options = DockerOptions(image=arm64_image, extra_labels=test_labels, mem_limit=EMULATION_MEM_LIMIT)
    with DockerSandbox.start(SandboxSpec(), options, client=docker_client) as sb:
        record("container start to ready", sb.timings)
        assert sb.time_scale == EMULATION_TIME_SCALE
        assert sb.agent.livez()
        assert sb.agent.display() == {"width": 1280, "height": 800, "depth": 24}
        result = sb.exec_in_guest(["uname", "-m"], timeout=30)
        assert (result.exit_code, result.stdout.strip()) == (0, b"aarch64")


def test_the_conformance_quick_modules_pass(arm64_image, test_labels, tmp_path):
    run_quick_conformance("conformance quick modules (container)", "tests.docker._conformance:conformance_desktop",
                          {"DESKTOP_SANDBOX_IMAGE": arm64_image, "DESKTOP_SANDBOX_TEST_LABELS": labels_json(test_labels)},
                          tmp_path / "junit.xml")


def test_the_pickup_exercise_passes_with_run_task_arch_arm64(arm64_image, tmp_path):
    from controller.run.record import read_entries, summarize

    runs = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "COLUMNS", "FORCE_COLOR")}
    run = subprocess.run(
        [sys.executable, "-m", "controller.cli", "run-task", "tasks/pickup.toml", "--offline", "--arch", "arm64",
         "--runs-dir", str(runs)],
        cwd=REPO, env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=RUN_TASK_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    [record_dir] = [p for p in runs.iterdir() if p.is_dir()]
    s = summarize(read_entries(record_dir))
    record("pickup run-task --arch arm64", {"wall_s": float(s["wall_s"]), "expectations_met": s["expectations_met"],
                                            **(s.get("timings") or {})})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert (s["expectations_met"], s["expectations_unmet"]) == (7, 0), s
    entry = next(e for e in read_entries(record_dir) if getattr(e, "image", None))
    assert entry.time_scale == EMULATION_TIME_SCALE, entry
