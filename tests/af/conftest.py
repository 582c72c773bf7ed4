"""Fixtures for the Agent Framework tests: the real agent on a private Xvfb observed by the probe window
(as tests/loop), scripted models on loopback, and a :class:`controller.af.SandboxComputer` on that
desktop whose person answers every question with a fixed line."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from rich.console import Console

from controller.offline.scripted_server import ScriptedModel, ScriptedServer
from controller.run.driver import ScreenshotPolicy
from tests.af.batch_model import BatchModel
from tests.loop.conftest import Desk
from tests.require import require_commands

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The framework's one-time experimental-feature warning for computer use is expected here."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.filterwarnings(r"ignore:\[COMPUTER_USE\]"))


@pytest.fixture(scope="module")
def desk() -> Iterator[Desk]:
    """A 1280x800 Xvfb with the real agent and the probe window (what real X clients received)."""
    require_commands("X", "Xvfb", install="apt-get install xvfb")
    d = Desk(1280, 800)
    yield d
    d.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Any], ScriptedServer]]:
    """``serve(model)`` -> a started :class:`ScriptedServer` for a ScriptedModel (or BatchModel); stopped after."""
    servers: list[ScriptedServer] = []

    def start(model: Any) -> ScriptedServer:
        server = ScriptedServer(model).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def computer(desk: Desk, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``computer(answer, **kw)`` -> a SandboxComputer on the desk (1280x800 model px = screen px) whose
    person answers every question with ``answer`` (``"y"`` approves; a list: one answer per question, in
    order; None: nobody to ask), its console
    kept in ``.output`` (a StringIO); finished after the test."""
    from controller.af import SandboxComputer

    made: list[Any] = []

    def make(answer: str | list[str] | None, **kw: Any) -> Any:
        out = io.StringIO()
        answers = iter(answer) if isinstance(answer, list) else None
        asker = None if answer is None else (lambda question: next(answers) if answers is not None else answer)
        c = SandboxComputer(desk.client, runs_dir=tmp_path / "runs", name="af-test", asker=asker,
                            policy=ScreenshotPolicy(max_width=1280, max_height=800),
                            console=Console(file=out, width=200, emoji=False), **kw)
        c.output = out
        made.append(c)
        return c

    yield make
    for c in made:
        c.finish()


__all__ = ["BatchModel", "ScriptedModel"]
