"""The architecture helpers behind ``--arch`` (no emulation: these run in the everyday ``make test``)."""

from __future__ import annotations

import json

import pytest

from controller.sandbox import image


def test_a_foreign_arch_suffixes_the_tag_and_the_host_arch_keeps_it(monkeypatch):
    monkeypatch.setattr(image, "host_arch", lambda: "amd64")
    assert image.arch_tag("desktop-sandbox:latest", "arm64") == "desktop-sandbox:latest-arm64"
    assert image.arch_tag("desktop-sandbox:latest-arm64", "arm64") == "desktop-sandbox:latest-arm64"
    assert image.arch_tag("localhost:5000/desktop", "aarch64") == "localhost:5000/desktop:latest-arm64"
    assert image.arch_tag("debian:bookworm-slim", "amd64") == "debian:bookworm-slim"
    assert image.arch_tag("debian:bookworm-slim", None) == "debian:bookworm-slim"
    assert image.arch_of_tag("desktop-sandbox:latest-arm64") == "arm64"
    assert image.arch_of_tag("desktop-sandbox:latest") == "amd64"
    assert image.platform_of("aarch64") == "linux/arm64"


def test_only_a_foreign_image_is_slower_and_unknown_arches_are_refused(monkeypatch):
    monkeypatch.setattr(image, "host_arch", lambda: "amd64")
    assert image.time_scale_of("arm64") == image.EMULATION_TIME_SCALE > 1.0
    assert image.time_scale_of("amd64") == image.time_scale_of(None) == image.time_scale_of("s390x") == 1.0
    with pytest.raises(ValueError, match="unknown architecture"):
        image.normalize_arch("riscv64")


def test_the_cli_gives_docker_options_a_suffixed_tag_and_vm_options_an_arch(monkeypatch):
    import typer

    from controller.commands.common import with_arch
    from controller.sandbox.docker import DockerOptions
    from controller.sandbox.vm import VMOptions

    monkeypatch.setattr(image, "host_arch", lambda: "amd64")
    emulated = with_arch(DockerOptions(), "arm64")
    assert (emulated.image, emulated.mem_limit) == ("desktop-sandbox:latest-arm64", image.EMULATION_MEM_LIMIT)
    assert with_arch(DockerOptions(), "") == DockerOptions()
    assert with_arch(DockerOptions(), "amd64") == DockerOptions()
    assert with_arch(VMOptions(), "arm64").arch == "arm64"
    with pytest.raises(typer.Exit):
        with_arch(DockerOptions(), "mips")


def test_a_vm_image_directory_names_its_arch(tmp_path):
    from controller.sandbox.vm_image import image_arch

    assert image_arch(None) is None and image_arch(tmp_path) is None
    (tmp_path / "manifest.json").write_text(json.dumps({"arch": "arm64"}))
    assert image_arch(tmp_path) == "arm64"
    (tmp_path / "manifest.json").write_text("{not json")
    assert image_arch(tmp_path) is None
