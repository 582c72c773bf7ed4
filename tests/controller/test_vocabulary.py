"""The vocabularies' one home (controller/model): approval request kinds and check kinds are tables,
checked when imported; a kind outside its table is refused naming it -- at the registry, by the Agents
API's shapes, at task load and at verification -- never given a default; and a kind added to the table
is seen by every view (the terminal prompt, the console's data, the Agents API's required action)."""

from __future__ import annotations

import ast
import io
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from rich.console import Console

from controller.agents_api import shapes
from controller.model.checks import CHECK_KINDS, CheckKind, FileCheck, check_check_kinds, check_runners
from controller.model.errors import DesktopSandboxError, IncompleteVocabulary, UnknownKind
from controller.model.requests import (REQUEST_KINDS, RequestKind, check_request_kinds, register_request_kind,
                                       request_kind)
from controller.run import verify
from controller.run.approvals import ActionGate, TerminalAsker
from controller.run.registry import AnswerRefused, ApprovalRegistry, Request
from controller.run.tasks import TaskError, load_task

ROOT = Path(__file__).resolve().parents[2]
BOGUS = "bogus_kind"


# -- approval request kinds ------------------------------------------------------------------------------

def test_an_unknown_approval_kind_is_refused_at_open_naming_it_and_nothing_is_added():
    registry = ApprovalRegistry(timeout_s=None)
    with pytest.raises(UnknownKind) as refused:
        registry.open(BOGUS, "Go on?")
    assert BOGUS in str(refused.value) and "safety_check" in str(refused.value)  # it names the known ones too
    assert isinstance(refused.value, DesktopSandboxError) and isinstance(refused.value, ValueError)
    assert registry.all() == [] and registry.version == 0


def test_the_agents_api_shape_refuses_an_unknown_kind_instead_of_calling_it_a_safety_check():
    request = Request(id="req_x", kind=BOGUS, question="Go on?")  # built around the registry's open()
    with pytest.raises(UnknownKind, match=BOGUS):
        shapes.approval_action(request, "turn_1")
    with pytest.raises(UnknownKind, match=BOGUS):
        request.as_json()  # the console's data for it: refused as well, not shown as another kind


def test_unknown_names_are_shown_escaped_and_cut():
    hostile = "\x1b[2J" + "k" * 500
    message = str(UnknownKind(hostile, ["a"], "approval request kind"))
    assert "\x1b" not in message and len(message) < 160 and message.endswith("(known: a)")


def test_each_kind_keeps_its_agents_api_shape():
    registry = ApprovalRegistry(timeout_s=None)
    check = registry.open("safety_check", "Go on?", call_id="call_1", checks=[{"id": "sc_1", "code": "c"}],
                          actions=["click"])
    action = registry.open("action", "Run click?", actions=["click"])
    origin, _ = registry.mirror("oreq_1", origin="https://a.test", reason="held")
    assert shapes.approval_action(check, "t")["request"] == {
        "type": "safety_check", "checks": [{"id": "sc_1", "code": "c", "message": ""}], "actions": ["click"],
        "call_id": "call_1", "question": "Go on?"}
    assert shapes.approval_action(action, "t")["request"]["type"] == "safety_check"
    assert shapes.approval_action(origin, "t")["request"] == {"type": "browser_origin_access",
                                                              "origin": "https://a.test", "reason": "held"}
    signin = registry.open_signin("Sign in", credential_origin="https://a.test",
                                  fields=[{"id": "u", "label": "User", "required": True}], options=[])
    assert shapes.approval_action(signin, "t")["request"] == shapes.signin_request(signin) == {
        "type": "browser_authentication", "reason": "Sign in", "credential_origin": "https://a.test",
        "fields": [{"id": "u", "label": "User", "type": "text", "required": True}], "options": []}


def test_answers_come_from_the_table():
    registry = ApprovalRegistry(timeout_s=None)
    check = registry.open("safety_check", "Go on?")
    assert check.as_json()["answers"] == ["approve", "deny"] and check.as_json()["label"] == "safety check"
    with pytest.raises(AnswerRefused) as refused:
        registry.answer(check.id, "cancel", by="console")
    assert (refused.value.status, refused.value.code) == (400, "invalid_answer") and check.pending
    origin, _ = registry.mirror("oreq_2", origin="https://a.test", reason="held")
    assert origin.as_json()["answers"] == ["approve", "deny", "cancel"]


# -- check kinds -------------------------------------------------------------------------------------------

def test_an_unknown_check_kind_is_refused_at_task_load_naming_it(tmp_path):
    path = tmp_path / "task.toml"
    path.write_text('name = "t"\ninstructions = "x"\n[[checks]]\nkind = "ftp"\npath = "~/a"\n')
    with pytest.raises(TaskError) as refused:
        load_task(path)
    assert "'ftp'" in str(refused.value) and "'file', 'sqlite', 'page'" in str(refused.value)


class _Reader:
    def __init__(self) -> None:
        self.read: list[str] = []

    def read_file(self, path: str) -> bytes:
        self.read.append(path)
        return b"hello"


def test_verification_refuses_an_unknown_check_kind_before_any_check_runs():
    good = FileCheck(kind="file", path="~/a.txt", match="text", value="hello")
    odd = FileCheck.model_construct(kind="ftp", path="~/a.txt", match="text", value="hello")  # not validated
    reader, seen = _Reader(), []
    with pytest.raises(UnknownKind) as refused:
        verify.run_checks([good, odd], reader, home="/home/sandbox", on_result=seen.append)
    assert "'ftp'" in str(refused.value) and "check kind" in str(refused.value)
    assert reader.read == [] and seen == []  # never run as another kind, and nothing half-run


def test_every_check_kind_has_its_runner_and_the_dispatch_goes_through_the_table():
    assert set(verify.RUNNERS) == set(CHECK_KINDS) == {"file", "sqlite", "page"}
    check_runners(verify.RUNNERS)  # what the import of verify did
    result = verify.run_checks([FileCheck(kind="file", path="~/a.txt", match="text", value="hello")], _Reader())
    assert result[0]["kind"] == "file" and result[0]["passed"]


def _runner(check: Any, reader: Any, home: str) -> dict[str, Any]:
    return {}


class ZipCheck(BaseModel):
    """A crafted check model whose ``kind`` is not ``Literal["zip"]``."""

    kind: str = "zip"


def test_the_completeness_check_names_a_kind_without_a_runner_and_a_runner_without_a_kind():
    with pytest.raises(IncompleteVocabulary, match="no runner for check kind 'page'"):
        check_runners({"file": _runner, "sqlite": _runner})
    with pytest.raises(IncompleteVocabulary, match="a runner for 'ftp', which is not a check kind"):
        check_runners({**dict.fromkeys(CHECK_KINDS, _runner), "ftp": _runner})
    crafted = {**CHECK_KINDS, "zip": CheckKind("zip", ZipCheck)}
    with pytest.raises(IncompleteVocabulary, match="'zip'"):
        check_runners(verify.RUNNERS, crafted)
    with pytest.raises(IncompleteVocabulary, match="'zip'"):  # its model does not declare kind: Literal["zip"]
        check_check_kinds(crafted)
    with pytest.raises(IncompleteVocabulary, match="'sqlite'"):  # filed under another kind's model
        check_check_kinds({"file": CHECK_KINDS["file"], "sqlite": CheckKind("sqlite", FileCheck)})


def test_the_request_kinds_table_is_checked():
    base = REQUEST_KINDS["action"]
    bad = {
        "answers": RequestKind("odd", "odd", ("approve",), "odd", base.api_request),
        "name": RequestKind("other", "odd", ("approve", "deny"), "odd", base.api_request),
        "label": RequestKind("odd", "action", ("approve", "deny"), "odd", base.api_request),
        "api type": RequestKind("odd", "odd", ("approve", "deny", "cancel"), "safety_check", base.api_request),
    }
    for kind in bad.values():
        with pytest.raises(IncompleteVocabulary, match="'odd'"):
            check_request_kinds({**REQUEST_KINDS, "odd": kind})
    with pytest.raises(IncompleteVocabulary, match="already defined"):
        register_request_kind(base)
    assert set(REQUEST_KINDS) == {"safety_check", "action", "origin_access", "browser_authentication"}


# -- a throwaway kind, seen by every view --------------------------------------------------------------------

TEST_KIND = RequestKind("test_kind", "throwaway question", ("approve", "deny"), "test_kind_request",
                        lambda request: {"question": request.question, "actions": request.actions})


@pytest.fixture
def test_kind():
    unregister = register_request_kind(TEST_KIND)
    try:
        yield TEST_KIND
    finally:
        unregister()
    assert "test_kind" not in REQUEST_KINDS


def test_a_registered_kind_is_asked_on_the_terminal_with_its_label(test_kind):
    read, write = os.pipe()
    out = io.StringIO()
    with os.fdopen(read, "r") as stream, os.fdopen(write, "w") as typing:
        typing.write("y\n")
        typing.flush()
        asker = TerminalAsker(Console(file=out, force_terminal=False, emoji=False, width=200), stream)
        registry = ApprovalRegistry(timeout_s=None)
        request = ActionGate(asker=asker, registry=registry).open_and_ask("test_kind", "Go on?", actions=["wait"])
    assert request.approved and request.by == "terminal"
    shown = out.getvalue()
    assert f"  (throwaway question, request {request.id})" in shown and "Go on? [y/N]" in shown


def test_a_registered_kind_is_in_the_consoles_data(test_kind):
    registry = ApprovalRegistry(timeout_s=None)
    request = registry.open("test_kind", "Go on?", actions=["wait"])
    # GET /runs/{id}/approvals serves the registry's snapshot as it is (controller/console/app.py)
    (shown,) = registry.snapshot()["pending"]
    assert (shown["id"], shown["kind"], shown["label"], shown["answers"]) == (
        request.id, "test_kind", "throwaway question", ["approve", "deny"])
    assert "credential_origin" not in shown  # only the sign-in kind has its fields
    assert registry.answer(request.id, "approve", by="console").approved


def test_a_registered_kind_is_an_agents_api_required_action(test_kind):
    request = ApprovalRegistry(timeout_s=None).open("test_kind", "Go on?", actions=["wait"])
    assert request_kind("test_kind") is test_kind
    assert shapes.approval_action(request, "turn_1") == {
        "type": "computer_use_approval_request", "request_id": request.id, "turn_id": "turn_1",
        "request": {"type": "test_kind_request", "question": "Go on?", "actions": ["wait"]}}


# -- the home itself ----------------------------------------------------------------------------------------

def test_the_vocabulary_home_is_pure():
    """controller/model imports nothing of the run, the Agents API or the console, and nothing that does I/O
    (of pathlib only the pure paths)."""
    forbidden = ("controller.run", "controller.agents_api", "controller.console", "os", "subprocess", "socket",
                 "shutil", "sqlite3", "requests", "httpx", "io")
    wrong = []
    for path in sorted((ROOT / "controller" / "model").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                pure = node.module == "pathlib" and all(a.name.startswith("Pure") for a in node.names)
                names = [] if pure else [node.module or ""]
            else:
                continue
            wrong += [f"{path.name}: {n}" for n in names
                      if n == "pathlib" or any(n == f or n.startswith(f + ".") for f in forbidden)]
    assert not wrong, wrong
