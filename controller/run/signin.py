"""Sign-in the model never sees: ``browser_authentication`` requests answered by a person, filled into
the page by the agent (docs/ARCHITECTURE.md, contract 8).

The flow (:class:`SignInFlow`) runs as part of the driver's ``before_capture``, so the model is paused:
before each screenshot the model is sent, the agent reports the sign-in form of its chromium's active
tab (``GET /v1/browser/signin``). When there is one on an origin the task's policy lets through (its
``allow`` tier, or an ``ask`` origin a person approved in this run) and ``[signin] enabled`` is true, the
flow opens a ``browser_authentication`` request in the run's approval registry (the terminal, the web
console, ``--sign-in FILE`` and the Agents API answer the same request: first answer wins), waits, and
hands the values of a submit straight to the agent (``POST /v1/browser/signin``), which types them in
while the page's origin is still the request's ``credential_origin``, and submits. A sign-in may take
several requests (method, then e-mail, then code): after each submit the next form on the page, if any,
is the next request, at most :data:`MAX_STEPS`. A cancel, a timeout or a failed fill ends it; the same
form is not asked about again (the model then sees the page). The screenshot the model gets next is
taken after all this, so it never shows a credential being typed.

Nothing of a value is kept: the registry holds a submit's values apart until the flow takes them
(:meth:`ApprovalRegistry.take_values`), the flow drops its reference once the agent answered, and the
record gets a ``sign_in`` line (:class:`controller.run.entries.SignIn`) with ids and outcomes only.
Python's strings cannot be wiped: a value's memory is freed, not overwritten, when the last reference
goes.

Answering: :class:`SignInPrompter` asks on the terminal (reason and origin shown escaped, "Have you
verified the sign-in destination?" first, as the hosted sessions' example does; every value read with
echo off); :class:`SignInFile` answers from a TOML file of origin -> values (``--sign-in FILE``), read
anew for each request and refused when group or world can read it.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from controller.model.errors import DesktopSandboxError
from controller.run.registry import RequestWorker, SIGN_IN, AnswerRefused, ApprovalRegistry, Request
from controller.text import clean

MAX_STEPS = 5
"""Most requests one sign-in makes (method, e-mail, code... and retries after a refused value)."""
MAX_SIGNIN_FILE_BYTES = 64 * 1024
"""Largest ``--sign-in`` file read (bytes)."""
KINDS = ("password", "email", "code")


class SignInFileError(DesktopSandboxError, ValueError):
    """A ``--sign-in`` file that cannot be used: unreadable, readable by group or others, not TOML, or
    not a table of origin -> table of strings."""


def read_signin_file(path: Path) -> dict[str, dict[str, str]]:
    """Read a ``--sign-in`` file: ``{origin: {key: value}}`` where a key is a field id, a field kind
    (``email``, ``password``, ``code``) or ``method`` (an option's id or a word of its label). Read
    anew each time (values are not kept between requests). Raises :class:`SignInFileError` (the
    message names the file and the rule, never a value)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise SignInFileError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SignInFileError(f"{path}: not a regular file")
        if info.st_mode & 0o077:
            raise SignInFileError(f"{path}: readable by group or others (mode {stat.S_IMODE(info.st_mode):04o}); "
                                  f"chmod 600 it")
        data = os.read(fd, MAX_SIGNIN_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SIGNIN_FILE_BYTES:
        raise SignInFileError(f"{path}: larger than {MAX_SIGNIN_FILE_BYTES} bytes")
    parsed = None
    try:  # no exception of the decoder's may travel on: it holds the file's bytes
        parsed = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        pass
    finally:
        del data
    if parsed is None:
        raise SignInFileError(f"{path}: not UTF-8 TOML")
    if not all(isinstance(table, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in table.items())
               for table in parsed.values()):
        raise SignInFileError(f'{path}: expected tables of strings: ["https://origin"] then key = "value" lines')
    return parsed


def check_signin_file(path: Path) -> None:
    """Refuse an unusable ``--sign-in`` file before the run starts (:func:`read_signin_file`'s rules);
    its values are read and dropped."""
    read_signin_file(path).clear()


def pick_option(options: list[dict[str, Any]], wanted: str) -> dict[str, Any] | None:
    """The option ``wanted`` names (the terminal's answer, a file's ``method``): its number in the list
    (1-based), its id, or a whole word of its label, case-insensitive, in that order; None for no match."""
    wanted = wanted.strip().lower()
    if not wanted:
        return None
    if wanted.isdigit() and 1 <= int(wanted) <= len(options):
        return options[int(wanted) - 1]
    return (next((o for o in options if o["id"].lower() == wanted), None)
            or next((o for o in options if wanted in o["label"].lower().split()), None))


def answer_from_table(request: Request, table: dict[str, str]) -> dict[str, Any]:
    """The answer a ``--sign-in`` table gives ``request``: the option named by ``method`` (an option id,
    or a case-insensitive word of its label), then for each active field the value under its id, else
    under its kind. A cancel when the table names no usable option or lacks a required field."""
    cancel = {"action": "cancel"}
    option = None
    active = request.fields
    if request.options:
        option = pick_option(request.options, table.get("method", ""))
        if option is None:
            return cancel
        active = [f for f in request.fields if f["id"] in option["field_ids"]]
    fields = []
    for field in active:
        value = table.get(field["id"], table.get(field.get("kind") or "", ""))
        if value:
            fields.append({"field_id": field["id"], "value": value})
        elif field.get("required"):
            return cancel
    if not fields and active:
        return cancel
    answer: dict[str, Any] = {"action": "submit", "fields": fields}
    if option is not None:
        answer["selected_option"] = option["id"]
    return answer


class SignInFile:
    """Answers sign-in requests from a ``--sign-in`` file (unattended runs): subscribed to the registry,
    it answers each new request from the file's table for the request's ``credential_origin`` (cancel
    when the file has none, or cannot be read any more: said on ``console``)."""

    def __init__(self, path: Path, registry: ApprovalRegistry, console: Console | None = None) -> None:
        self.path, self.registry, self.console = path, registry, console
        self._worker = RequestWorker(registry, SIGN_IN, self.answer, name="signin-file")

    def answer(self, request: Request) -> None:
        """Answer one request from the file (see the class docstring)."""
        try:
            tables = read_signin_file(self.path)
        except SignInFileError as exc:
            self._say(f"--sign-in: {exc}; cancelling the sign-in")
            tables = {}
        table = tables.get(request.credential_origin or "")
        tables.clear()
        response = answer_from_table(request, table) if table else {"action": "cancel"}
        if table:
            table.clear()
        try:
            self.registry.answer_signin(request.id, response, by="sign-in file")
        except AnswerRefused as refused:
            self._say(f"--sign-in: not taken: {clean(refused.message, 300)} ({refused.code})"
                      + ("; cancelling the sign-in" if refused.status == 400 else ""))
            if refused.status == 400:  # the file's values break a rule: it would give the same ones again
                try:
                    self.registry.answer_signin(request.id, {"action": "cancel"}, by="sign-in file")
                except AnswerRefused:
                    pass
        finally:
            response.clear()

    def _say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(clean(text, 500), markup=False, emoji=False, highlight=False)

    def stop(self) -> None:
        """Stop answering."""
        self._worker.stop()


class SignInPrompter:
    """Asks sign-in requests on the terminal (``asker``: the run's ``TerminalAsker``), one at a time on a
    thread of its own, following the hosted sessions' example (``004``): the reason and the credential
    origin (escaped), "Have you verified the sign-in destination? [y/N]", the method (numbered), then each
    active field with echo off (an empty value: ``cancel`` or, for an optional field, skip). Anything but
    yes, or ``cancel`` at any step, cancels. The prompt is given up when the request is decided elsewhere."""

    def __init__(self, asker: Any, registry: ApprovalRegistry, console: Console | None = None) -> None:
        self.asker, self.registry = asker, registry
        self.console = console or asker.console
        self._worker = RequestWorker(registry, SIGN_IN, self.ask, name="signin-prompts")
        self._stopped = self._worker.stopped

    def stop(self) -> None:
        """Stop asking (a waiting prompt is given up)."""
        self._worker.stop()

    def ask(self, request: Request) -> None:
        """Ask one request on the terminal and answer it (or leave it to another view)."""
        done = lambda: not request.pending or self._stopped.is_set()  # noqa: E731
        with self.asker.lock:
            lines = [f"Sign-in request: {clean(request.question, 500)}",
                     f"  Credential origin: {clean(request.credential_origin or 'Not supplied', 300)}"]
            if self.registry.views:
                lines.append("  (the console can answer too: the first answer counts)")
            line = self.asker.ask_until("Have you verified the sign-in destination?", done, hint="[y/N]", lines=lines)
            if line is None:
                return
            if line.strip().lower() not in ("y", "yes"):
                return self._send(request, {"action": "cancel"})
            option = None
            active = request.fields
            if request.options:
                listing = [f"  {n}. {clean(o['label'], 200)}" for n, o in enumerate(request.options, start=1)]
                while option is None:
                    line = self.asker.ask_until("Choose a sign-in method (its number or name), or enter cancel:",
                                                done, hint="", lines=listing)
                    if line is None:
                        return
                    if line.strip().lower() == "cancel":
                        return self._send(request, {"action": "cancel"})
                    option = pick_option(request.options, line)
                    listing = [] if option else [f"  {clean(line, 80)!r} names none of the methods above"]
                active = [f for f in request.fields if f["id"] in option["field_ids"]] if option else active
            fields: list[dict[str, str]] = []
            try:
                for field in active:
                    label = clean(field["label"] or field["id"], 200) + ("" if field["required"] else " (optional)")
                    while True:
                        value = self.asker.ask_until(f"{label} (input hidden; empty: cancel or skip):", done,
                                                     hint="", secret=True)
                        if value is None:
                            return
                        if value:
                            fields.append({"field_id": field["id"], "value": value})
                            break
                        if not field["required"]:
                            break
                        again = self.asker.ask_until("Enter a value or cancel sign-in?", done, hint="[enter/cancel]")
                        if again is None:
                            return
                        if again.strip().lower() == "cancel":
                            return self._send(request, {"action": "cancel"})
                response: dict[str, Any] = {"action": "submit", "fields": fields}
                if option is not None:
                    response["selected_option"] = option["id"]
                self._send(request, response)
            finally:
                fields.clear()

    def _send(self, request: Request, response: dict[str, Any]) -> None:
        try:  # what came of it is the run's sign_in line; only a refusal is said here
            self.registry.answer_signin(request.id, response, by="terminal")
        except AnswerRefused as refused:
            self.console.print(f"  not taken: {clean(refused.message, 300)} ({refused.code}): {request.state}",
                               markup=False, emoji=False, highlight=False)
        finally:
            response.clear()


class SignInFlow:
    """The driver's sign-in step (module docstring). ``agent``: the agent client (``signin_page``,
    ``signin_fill``); ``allows(origin)``: whether the policy lets the origin through; ``write``: writes
    a record entry; ``answerable()``: whether anyone can answer (terminal, console, a file, the API);
    ``cancelled()``: the run's cancellation flag; ``screenshot()``: the record's name of the last
    screenshot (shown with the request)."""

    def __init__(self, agent: Any, registry: ApprovalRegistry, *, allows: Callable[[str], bool],
                 write: Callable[[Any], None], answerable: Callable[[], bool], cancelled: Callable[[], bool],
                 screenshot: Callable[[], str | None] = lambda: None) -> None:
        self.agent, self.registry, self.allows, self.write = agent, registry, allows, write
        self.answerable, self.cancelled, self.screenshot = answerable, cancelled, screenshot
        self._done: set[tuple[str, str, str]] = set()
        self._refused_noted: set[str] = set()

    @staticmethod
    def _key(page: Any) -> tuple[str, str, str]:
        form = page.form
        shape = ",".join([f.id for f in form.fields] + ["|"] + [o.id for o in form.options])
        return page.origin, page.url, shape

    def __call__(self) -> bool:
        """Run the sign-in step; True when it asked (the screen must be captured anew)."""
        from controller.agent_client import AgentError

        try:
            page = self.agent.signin_page()
        except AgentError:
            return False
        if page is None or page.form is None or self._key(page) in self._done:
            return False
        if not self.allows(page.origin):
            if page.origin not in self._refused_noted:
                self._refused_noted.add(page.origin)
                self._record(None, 1, page, "refused_origin",
                             detail="the page's origin is not one the task's policy lets through: nothing asked")
            return False
        for step in range(1, MAX_STEPS + 1):
            key = self._key(page)
            self._done.add(key)
            refusal = page.form.refusal(page.origin)
            if refusal is not None:  # the values would leave by GET or for another origin: nobody is asked
                self._record(None, step, page, refusal[0], detail=refusal[1])
                return step > 1
            by = self._ask_and_fill(page, step)
            if by is None:
                return True
            try:
                page = self.agent.signin_page()
            except AgentError:
                return True
            if page is None or page.form is None or not self.allows(page.origin):
                return True
            if self._key(page) == key and by == "sign-in file":  # the file would give the same values again
                self._record(None, step, page, "same_form", detail="the page showed the same form again after the "
                             "submit: the site did not take the file's values")
                return True
        return True

    def _ask_and_fill(self, page: Any, step: int) -> str | None:
        """One request and its fill: who answered when the form was submitted (the sign-in may go on),
        else None."""
        from controller.agent_client import AgentError
        from wire.browser import FillField, FillRequest

        form = page.form
        reason = f"The page at {page.origin} asks you to sign in" + (f" (step {step})" if step > 1 else "")
        request = self.registry.open_signin(reason, credential_origin=page.origin,
                                            fields=[f.model_dump() for f in form.fields],
                                            options=[o.model_dump() for o in form.options],
                                            screenshot=self.screenshot())
        if not self.answerable():
            self.registry.resolve(request.id, "cancelled", by="no-approver",
                                  reason="nobody can answer a sign-in request (no terminal, console or --sign-in file)")
        self.registry.wait(request, self.cancelled)
        if request.state != "submitted":
            outcome = {"denied": "timeout", "withdrawn": "withdrawn"}.get(request.state, request.state)
            if request.by == "no-approver":
                outcome = "no_approver"
            self._record(request, step, page, outcome, detail=request.reason)
            return None
        values = self.registry.take_values(request)
        try:
            fill = FillRequest(credential_origin=page.origin, selected_option=request.selected_option,
                               fields=[FillField(field_id=i, value=v) for i, v in values])
        except ValueError:
            self._record(request, step, page, "error", detail="the answer does not fit the fill's limits")
            return None
        finally:
            values.clear()
        redactor = getattr(self.agent, "redactor", None)
        # the whole screen out of every picture while a field may hold a value (controller.redaction)
        held = redactor.hold("sign_in") if redactor is not None else None
        unanswered = False
        try:
            result = self.agent.signin_fill(fill)
        except AgentError as exc:
            unanswered = exc.status == 0
            self._record(request, step, page, "error", detail=f"{exc.code}: {exc}")
            return None
        finally:
            del fill
            if held is not None and not (unanswered and not self._fill_over()):
                redactor.release(held)
            # else kept: the agent may still be typing the values; the run lets it go as it ends
        self._record(request, step, page, result.outcome, navigated=result.navigated, detail=result.detail or None,
                     destination=result.destination or None)
        return request.by if result.outcome == "submitted" else None

    def _fill_over(self) -> bool:
        """After a fill call that got no answer (cut at its deadline, or as the run stops): whether the
        agent is heard from again. Its chromium takes one call at a time, so any answer to asking for the
        page comes after the fill ended there; no answer: it may still be typing."""
        from controller.agent_client import AgentError

        try:
            self.agent.signin_page()
        except AgentError as exc:
            return exc.status != 0
        return True

    def _record(self, request: Request | None, step: int, page: Any, outcome: str, *,
                navigated: bool | None = None, detail: str | None = None, destination: str | None = None) -> None:
        from controller.run.entries import SignIn

        destination = destination or page.form.destination  # as the agent read the form, when the fill did not
        self.write(SignIn(
            request_id=request.id if request else None, step=step, origin=clean(page.origin, 300),
            destination=clean(destination, 300) if destination else None,
            fields=[clean(f.id, 80) for f in page.form.fields], options=[clean(o.id, 80) for o in page.form.options],
            method=request.selected_option if request else None,
            submitted=list(request.submitted_fields) if request else [], outcome=outcome, navigated=navigated,
            by=request.by if request else None, detail=None if detail is None else clean(detail, 300)))
