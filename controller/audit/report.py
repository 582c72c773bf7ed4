"""The audit's report: the JSON model (``AuditReport``, one ``ProbeResult`` per probe) and its text form
(``render_table``). The JSON report is documented in docs/audit.md ("JSON report")."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Literal, Optional

from pydantic import BaseModel, Field

from controller.text import clean

REPORT_VERSION = 1
Expected = Literal["blocked", "allowed"]

NARROW_COLUMNS = 120
"""Below this console width the audit prints one line per probe instead of a table."""
SHOWN = 400
"""Characters of a probe's name, target or observation shown on the console (longer ones are cut)."""


class ProbeResult(BaseModel):
    """One probe's verdict. ``expected``/``observed`` are short words (see docs/audit.md); ``escaped`` is
    True when something expected to be blocked got through (observed in the guest or recorded at a
    target)."""

    name: str
    category: str
    target: str
    expected: Expected
    observed: str
    passed: bool
    escaped: bool = False
    detail: Any = None


class AuditReport(BaseModel):
    """The audit's JSON report (documented in docs/audit.md)."""

    version: int = REPORT_VERSION
    started: str
    finished: str = ""
    sandbox: str = ""
    image: str = ""
    policy: dict[str, Any]
    effective_policy: dict[str, Any]
    canary: str
    probes: list[ProbeResult] = Field(default_factory=list)
    target_hits: list[dict[str, Any]] = Field(default_factory=list)
    host_hits: list[dict[str, Any]] = Field(default_factory=list)
    decisions: list[dict[str, Any]] = Field(default_factory=list)
    swap: Optional[dict[str, Any]] = None
    """How the audited policy got into the running gateway when the sandbox did not start with it
    (controller.audit.swap.SwapRecord.summary): ``how`` (``set_policy`` | ``pool-claim``), ``from``,
    ``policy`` (the gateway's answer), ``closed``, ``pending_refused``, ``decisions_before``, ``claim``;
    None when the sandbox started with it."""

    @property
    def passed(self) -> bool:
        """Every probe passed."""
        return all(p.passed for p in self.probes)

    @property
    def escaped(self) -> list[str]:
        """Names of probes that escaped."""
        return [p.name for p in self.probes if p.escaped]

    def to_json(self) -> str:
        """The report as JSON text, with the derived ``passed`` and ``escaped`` fields."""
        data = self.model_dump(mode="json")
        data["passed"] = self.passed
        data["escaped"] = self.escaped
        return json.dumps(data, indent=2)


def utc_now() -> str:
    """The current UTC time, ISO 8601 with milliseconds (the report's ``started``/``finished``)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def swap_note(swap: Optional[dict[str, Any]]) -> str:
    """The title's words on a swapped policy (empty when the sandbox started with the audited one):
    ``, swapped in at runtime from <mode>`` and/or ``, on a sandbox claimed from a warm pool``."""
    if not isinstance(swap, dict):
        return ""
    start = swap.get("from")
    mode = start.get("mode") if isinstance(start, dict) else None
    claimed = isinstance(swap.get("claim"), dict)
    return f", swapped in at runtime from {mode}" + (", on a sandbox claimed from a warm pool" if claimed else "")


def render_table(report: AuditReport, console: Any) -> None:
    """Print the report on ``console`` (a rich Console) as a table (one row per probe) and a verdict line;
    on a console narrower than :data:`NARROW_COLUMNS`, one line per probe (``pass name (category) target:
    expected ..., observed ...``) so that names are never split. Every shown string is made printable
    (controller.text.clean, at most :data:`SHOWN` characters) and markup-escaped, and nothing is read
    as an emoji code, whatever the console."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    def shown(value: Any) -> str:
        return escape(clean(value, SHOWN))

    def cell(markup: str) -> Text:
        return Text.from_markup(markup, emoji=False)

    title = Text.from_markup(shown(f"network audit of {report.sandbox} ({report.policy.get('mode')})"
                                   + swap_note(report.swap)), style="table.title", emoji=False)

    def verdict(p: ProbeResult) -> str:
        return "[green]pass[/]" if p.passed else ("[bold red]ESCAPED[/]" if p.escaped else "[red]fail[/]")

    if console.width < NARROW_COLUMNS:
        console.print(title)
        for p in report.probes:
            console.print(f"{verdict(p)} {shown(p.name)} ({shown(p.category)}) {shown(p.target)}: "
                          f"expected {shown(p.expected)}, observed {shown(p.observed)}", emoji=False, highlight=False)
    else:
        table = Table(title=title)
        # Short words never wrap; long targets and observations fold (a piped console is wide, see
        # controller.run.progress.make_console).
        for column in ("probe", "category", "target", "expected", "observed", "result"):
            if column in ("target", "observed"):
                table.add_column(column, overflow="fold")
            else:
                table.add_column(column, no_wrap=True)
        for p in report.probes:
            table.add_row(*(cell(shown(v)) for v in (p.name, p.category, p.target, p.expected, p.observed)),
                          cell(verdict(p)))
        console.print(table)
    failed = [p.name for p in report.probes if not p.passed]
    if not failed:
        console.print(f"[green]all {len(report.probes)} probes passed[/]", emoji=False)
    else:
        escaped = escape(clean(str(report.escaped or "none"), 4 * SHOWN))
        console.print(f"[red]{len(failed)} of {len(report.probes)} probes failed; escaped: {escaped}[/]", emoji=False)
