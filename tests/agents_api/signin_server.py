"""A ``serve`` process whose sessions need no Docker, for the sign-in tests (``test_signin.py``).

``python -m tests.agents_api.signin_server RUNS_DIR`` runs :func:`controller.agents_api.server.serve_forever`
(its one line on stderr, until SIGTERM) with two stand-ins, both set up in this process only:

* the backend ``fake`` (:class:`FakeSandbox`): a sandbox that starts at once and is always alive;
* ``run_task`` (:func:`fake_run_task`): a turn's run as the runner shares it with a view -- its approval
  registry, :class:`LiveRun`, record -- that opens one ``browser_authentication`` request in the
  registry (the form named by the turn's text, :data:`FORMS`), waits for the answer as the runner's
  sign-in step does, takes a submit's values (:meth:`ApprovalRegistry.take_values`) and ends the turn
  with a line saying what came: the state, who answered, the option, the field ids and the sha256 of
  the values as JSON (``[[field_id, value], ...]``) -- never a value.

Everything else is the real server: routes, sessions, the pump, the store. Logging is at DEBUG on the
root logger (stderr), so any log line of the server's would be in the captured output.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ORIGIN = "https://login.example.test"
"""The ``credential_origin`` of every request."""
EMAIL = {"id": "email", "label": "Email address", "type": "email", "required": True, "kind": "email"}
PASSWORD = {"id": "password", "label": "Password", "type": "password", "required": True, "kind": "password"}
FORMS: dict[str, dict[str, Any]] = {
    "plain": {"fields": [EMAIL, PASSWORD] + [{"id": f"extra{i}", "label": f"Extra {i}", "type": "text",
                                               "required": False, "kind": "code"} for i in range(1, 5)],
              "options": []},
    "options": {"fields": [EMAIL, PASSWORD],
                "options": [{"id": "email_code", "label": "Email me a code", "field_ids": []},
                            {"id": "use_password", "label": "Use a password", "field_ids": ["email", "password"]}]},
}
"""The form a turn asks about, by the turn's text: ``plain`` (6 fields: email and password required, 4
optional) or ``options`` (two methods)."""


class FakeSandbox:
    """A sandbox of nothing: started at once, always alive, closed without a trace."""

    default_ready_timeout = 5.0

    def __init__(self) -> None:
        self.id = "fake-" + secrets.token_hex(6)
        self.agent = SimpleNamespace(livez=lambda: True)

    @classmethod
    def make_options(cls, image: str | None = None) -> Any:
        return SimpleNamespace(image=image)

    @classmethod
    def start(cls, spec: Any, options: Any) -> "FakeSandbox":
        return cls()

    @classmethod
    def remove(cls, sandbox_id: str) -> list[str]:
        return []

    def attach_gateway(self, network: str) -> None:
        pass

    def close(self) -> None:
        pass


def fake_run_task(task: Any, open_sandbox: Any, options: Any, console: Any = None) -> Any:
    """One turn (see the module docstring), with the runner's hooks in the runner's order."""
    from controller.run.entries import SignIn
    from controller.run.live import LiveRun
    from controller.run.record import RunRecord, new_run_id
    from controller.run.registry import ApprovalRegistry
    from controller.run.runner import RunOutcome

    open_sandbox(task)
    registry = ApprovalRegistry(options.approval_timeout_s)
    record = RunRecord(options.runs_dir, new_run_id(task.name))
    view = LiveRun(record.run_id, record.dir, registry)
    registry.views.add("console")
    record.on_entry = view.on_entry
    cancelled = threading.Event()
    view.attach(None, (1280, 800), cancel=lambda _by: cancelled.set(), record_human=lambda _entry: None)
    options.on_live(view)
    options.on_record(record)
    form = FORMS.get(task.instructions.strip().split()[-1], FORMS["plain"])
    request = registry.open_signin("The page asks you to sign in", credential_origin=ORIGIN,
                                   fields=form["fields"], options=form["options"])
    registry.wait(request, cancelled.is_set)
    values = registry.take_values(request)
    digest = hashlib.sha256(json.dumps([list(v) for v in values]).encode()).hexdigest()
    values.clear()
    record.write(SignIn(request_id=request.id, step=1, origin=ORIGIN, fields=[f["id"] for f in form["fields"]],
                        options=[o["id"] for o in form["options"]], method=request.selected_option,
                        submitted=list(request.submitted_fields), outcome=request.state, by=request.by))
    text = (f"sign-in {request.state} by {request.by}; option {request.selected_option}; "
            f"fields {','.join(request.submitted_fields) or '-'}; sha256 {digest}")
    status = "cancelled" if cancelled.is_set() else "passed"
    try:
        if options.before_finish is not None:
            options.before_finish(status, "the sign-in step ended", text, [])
    finally:
        registry.close("run ended")
        view.finish(status)
    return RunOutcome(status=status, reason="the sign-in step ended", record_dir=record.dir, checks=[],
                      final_message=text)


def main(runs_dir: str) -> None:
    import controller.run.runner as runner
    import controller.sandbox.registry as backends
    from controller.agents_api.server import ServeOptions, serve_forever
    from controller.agents_api.sessions import HubOptions

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    backends._ENTRIES["fake"] = ("tests.agents_api.signin_server", "FakeSandbox")
    runner.run_task = fake_run_task
    serve_forever(ServeOptions(hub=HubOptions(runs_dir=Path(runs_dir), backend="fake", approval_timeout_s=120)),
                  say=lambda line: print(line, file=sys.stderr, flush=True))


if __name__ == "__main__":
    main(sys.argv[1])
