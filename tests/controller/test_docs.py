"""The docs: the site builds with ``mkdocs build --strict`` and no warning (a broken link, a missing anchor,
a page left out of the nav: mkdocs.yml's ``validation``), README.md stays a two-minute read whose every
relative link resolves to a file, and the command line page holds the CLI's help as the CLI prints it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_BYTES = 8192


def _mkdocs_build(site: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_site_builds_strictly_without_a_warning(tmp_path):
    built = _mkdocs_build(tmp_path / "site")
    output = built.stdout + built.stderr
    assert built.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "cli" / "index.html").is_file()


FAULTS = {
    "a link to no page": ("index.md", "\n[gone](no-such-page.md)\n"),
    "a link to no anchor": ("index.md", "\n[no anchor](tasks.md#no-such-anchor)\n"),
    "a page left out of the nav": ("left-out.md", "# Not in the nav\n"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_fails_the_build(tmp_path, fault):
    # the same config on a copy of the docs with one fault added: mkdocs.yml's validation must make it a
    # warning, which --strict turns into a failed build
    docs = tmp_path / "docs"
    docs.mkdir()
    for page in (ROOT / "docs").iterdir():
        if page.is_file():
            (docs / page.name).write_bytes(page.read_bytes())
    name, text = FAULTS[fault]
    with (docs / name).open("a") as page:
        page.write(text)
    config = tmp_path / "mkdocs.yml"
    config.write_text((ROOT / "mkdocs.yml").read_text().replace("site_dir: build/site", "site_dir: site"))
    built = _mkdocs_build(tmp_path / "site", config)
    output = built.stdout + built.stderr
    assert built.returncode != 0, output
    assert "WARNING" in output, output


def _relative_links(markdown: str) -> list[str]:
    """Targets of inline links and images (``[text](target)``, ``![alt](target)``) that are not URLs."""
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", markdown)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def test_the_readme_is_short_and_its_relative_links_resolve():
    readme = ROOT / "README.md"
    size = len(readme.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes (at most {README_MAX_BYTES}): move detail to docs/"
    links = _relative_links(readme.read_text())
    assert links, "README.md links into the docs"
    missing = [t for t in links if not (ROOT / t.split("#", 1)[0]).is_file()]
    assert not missing, f"README.md links to what is not a file: {missing}"


def test_relative_links_are_found():
    text = "see [a](docs/a.md#x), ![pic\nture](docs/p.png) and [web](https://example.test/) [top](#top)"
    assert _relative_links(text) == ["docs/a.md#x", "docs/p.png"]


RICH_TAG = re.compile(r"(?<!\\)\[([a-z#/@][^\[\]]*?)\]")
"""What rich markup takes for a style tag and drops from the help it renders (``[network]``, ``[af]``,
``[default: 30]``); ``\\[network]`` is shown as ``[network]``."""


def test_no_help_text_loses_words_in_square_brackets():
    import typer.main

    from controller.cli import app

    def texts(command, path):
        yield path, command.help or ""
        for param in command.params:
            yield f"{path} {param.name}", getattr(param, "help", None) or ""
        for name, sub in getattr(command, "commands", {}).items():
            yield from texts(sub, f"{path} {name}")

    lost = [(where, m.group(0)) for where, text in texts(typer.main.get_command(app), "desktop-sandbox")
            for m in RICH_TAG.finditer(text)]
    assert lost == [], "write \\[ in help texts: rich markup drops these"
    assert RICH_TAG.findall("a [network] table, an [af] extra, \\[record] kept, host[:port] kept") == ["network", "af"]


def test_the_cli_page_carries_the_help_rendered_from_the_cli():
    from controller.commands import cli_reference

    doc = (ROOT / "docs" / "cli.md").read_text()
    block = re.search(r"<!-- cli-reference:start -->\n(.*?)<!-- cli-reference:end -->", doc, re.S)
    assert block, "docs/cli.md lost its cli-reference block"
    assert block.group(1) == cli_reference.reference_markdown(), (
        "run: python -m controller.commands.cli_reference, paste into docs/cli.md")
    from controller.cli import app

    for command in app.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        assert f"### `desktop-sandbox {name}`" in block.group(1)
