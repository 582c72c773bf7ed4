"""A ``serve`` process whose sessions need no Docker, for the sign-in tests (``test_signin.py``).

``python -m tests.agents_api.signin_server RUNS_DIR`` runs :func:`controller.agents_api.server.serve_forever`
(its one line on stderr, until SIGTERM) with two stand-ins, both set up in this process only:

* the backend ``fake`` (:class:`FakeSandbox`): a sandbox that starts at once and is always alive;
* ``Run`` (:func:`fake_run`): a turn's run with the runner's bus, approval registry, view and record,
  whose phases stand in: it opens one ``browser_authentication`` request in the
  registry (the form named by the turn's text, :data:`FORMS`), waits for the answer as the runner's
  sign-in step does, takes a submit's values (:meth:`ApprovalRegistry.take_values`) and ends the turn
  with a line saying what came: the state, who answered, the option, the field ids and the sha256 of
  the values as JSON (``[[field_id, value], ...]``) -- never a value.

Everything else is the real server: routes, sessions, the events from the run's bus, the store. Logging is at DEBUG on the
root logger (stderr), so any log line of the server's would be in the captured output.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import sys
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


def fake_run() -> type:
    """The runner's :class:`controller.run.runner.Run` with its phases standing in (module docstring):
    the real bus, registry, record, view and ending; no model, no checks."""
    from controller.run.cancel import RunStopped
    from controller.run.entries import RunStarted, SignIn, TaskRef
    from controller.run.runner import Run

    class FakeRun(Run):
        def attach(self, sandbox: Any) -> None:
            self.record.write(RunStarted(task=TaskRef(name=self.task.name), mode="live", sandbox=sandbox.id))
            self.record.started = True
            if self.view is not None:
                self.view.attach(None, (1280, 800), cancel=self.cancel_by_view, record_human=lambda _entry: None)

        def ready(self) -> None:
            pass

        def drive(self) -> None:
            form = FORMS.get(self.task.instructions.strip().split()[-1], FORMS["plain"])
            request = self.registry.open_signin("The page asks you to sign in", credential_origin=ORIGIN,
                                                fields=form["fields"], options=form["options"])
            self.registry.wait(request, self.cancel)
            values = self.registry.take_values(request)
            digest = hashlib.sha256(json.dumps([list(v) for v in values]).encode()).hexdigest()
            values.clear()
            self.record.write(SignIn(request_id=request.id, step=1, origin=ORIGIN,
                                     fields=[f["id"] for f in form["fields"]], options=[o["id"] for o in form["options"]],
                                     method=request.selected_option, submitted=list(request.submitted_fields),
                                     outcome=request.state, by=request.by))
            self.final_message = (f"sign-in {request.state} by {request.by}; option {request.selected_option}; "
                                  f"fields {','.join(request.submitted_fields) or '-'}; sha256 {digest}")
            if self.cancel():
                raise RunStopped()
            self.status, self.reason = "passed", "the sign-in step ended"

        def verify(self) -> None:
            pass

        def settle(self) -> None:
            pass

    return FakeRun


def main(runs_dir: str) -> None:
    import controller.run.runner as runner
    import controller.sandbox.registry as backends
    from controller.agents_api.server import ServeOptions, serve_forever
    from controller.agents_api.sessions import HubOptions

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    backends._ENTRIES["fake"] = ("tests.agents_api.signin_server", "FakeSandbox")
    runner.Run = fake_run()
    serve_forever(ServeOptions(hub=HubOptions(runs_dir=Path(runs_dir), backend="fake", approval_timeout_s=120)),
                  say=lambda line: print(line, file=sys.stderr, flush=True))


if __name__ == "__main__":
    main(sys.argv[1])
