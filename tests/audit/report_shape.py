"""The audit's JSON report as docs/audit.md documents it, read from the document itself, and a check of
a report against it and against the product's model (``controller.audit.AuditReport``).

Shared by tests/audit/test_report.py (a report made without Docker) and tests/audit/test_audit_docker.py
(real audits).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from functools import cache
from pathlib import Path
from typing import Any, Sequence

import controller.audit.probes
from controller.audit import AuditReport, Probe, ProbePlan, ProbeResult
from controller.audit.swap import ROWS as SWAP_ROWS
from controller.gateway.policy import Decision

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _between(start: str, end: str) -> str:
    text = _text()
    i = text.index(start) + len(start)
    return text[i:text.index(end, i)]


def _ticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


@cache
def documented_report() -> dict[str, Any]:
    """The example report of "JSON report", without its ``// comments``."""
    block = _between("### JSON report", "\n```\n")
    block = block[block.index("```json") + len("```json"):]
    return json.loads(re.sub(r"\s+//.*$", "", block, flags=re.M))


@cache
def documented_categories() -> dict[str, list[str]]:
    """Probe groups (``category``) -> the probe names the document lists for it (the summary's)."""
    groups: dict[str, list[str]] = {}
    for bullet in re.split(r"\n(?=- )", _between("Probe groups (`category`):", "When the policy names")):
        m = re.match(r"- ((?:`[^`]+`(?:, )?)+):(.*)", " ".join(bullet.split()))
        if m:
            for category in _ticked(m.group(1)):
                groups[category] = _ticked(m.group(2)) if category == "summary" else []
    return groups


@cache
def documented_observed() -> list[re.Pattern[str]]:
    """The ``observed`` words and the summary probes' counts, as patterns (``<code>`` matches anything)."""
    words = _between("`observed` words:", "The summary probes show counts")
    counts = _between("The summary probes show counts", "passing when")
    forms = [w for w in _ticked(words) if " " not in w] + [w for w in _ticked(counts) if w.startswith("<n>")]

    def pattern(form: str) -> re.Pattern[str]:
        parts = re.split(r"(<[^>]+>)", form)
        return re.compile("".join((r"\d+" if part in ("<n>", "<m>") else r"\S+") if part.startswith("<")
                                  else re.escape(part) for part in parts))

    return [pattern(form) for form in forms]


@cache
def documented_decision() -> tuple[set[str], set[str]]:
    """(fields of a gateway decision, its ``via`` words), from the paragraph on ``decisions``."""
    text = _between("one object per decision:", "### Egress policy rules")
    via = set(_ticked(re.search(r"`via` \(([^)]*)\)", text).group(1)))
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\([^()]*\)", "", text)
    return set(_ticked(text)), via


def _utc(stamp: str) -> dt.datetime:
    when = dt.datetime.fromisoformat(stamp)
    assert when.utcoffset() == dt.timedelta(0), stamp
    return when


def check_report(data: dict[str, Any]) -> AuditReport:
    """Assert that ``data`` (a parsed ``--json`` report) has the documented shape; return it as the model."""
    doc = documented_report()
    assert set(data) == set(doc), f"fields not as documented: {set(data) ^ set(doc)}"
    report = AuditReport.model_validate(data)
    assert report.model_dump(mode="json") == {k: v for k, v in data.items() if k not in ("passed", "escaped")}
    assert data["version"] == doc["version"]
    assert _utc(data["started"]) <= _utc(data["finished"])
    assert data["sandbox"] and data["image"].startswith("sha256:")
    for policy in ("policy", "effective_policy"):
        assert set(data[policy]) == set(doc[policy]), data[policy]
        assert data[policy]["mode"] in ("deny-all", "allowlist")
    assert re.fullmatch(r"c[0-9a-f]+\.canary\.audit\.test", data["canary"]), data["canary"]

    categories = documented_categories()
    observed = documented_observed()
    names = [p["name"] for p in data["probes"]]
    assert len(names) == len(set(names)), "probe names must be unique"
    for probe in data["probes"]:
        assert set(probe) == set(doc["probes"][0]), probe
        assert probe["category"] in categories, probe
        assert probe["expected"] in ("blocked", "allowed"), probe
        assert any(p.fullmatch(probe["observed"]) for p in observed), f"undocumented observed word: {probe}"
        assert not (probe["escaped"] and (probe["passed"] or probe["expected"] != "blocked")), probe
        # only the origins a policy allows, the host's own reach of the console, and the swap target before
        # a policy swap (or a connection to it the swapped-in policy still allows) are expected through
        assert probe["expected"] == "blocked" or probe["category"] in ("origins", "swap") \
            or probe["name"] == "console-reachable-from-host", probe
    summary = [p["name"] for p in data["probes"] if p["category"] == "summary"]
    assert summary == categories["summary"], summary
    swap_rows = [p["name"] for p in data["probes"] if p["category"] == "swap"]
    assert swap_rows in ([], list(SWAP_ROWS)), swap_rows
    assert names[:len(swap_rows)] == swap_rows, "the swap rows come first"
    if swap_rows:
        assert data["swap"] is not None and data["swap"]["how"] == "set_policy", data["swap"]
    if data["swap"] is not None:
        assert set(data["swap"]) == set(doc["swap"]), data["swap"]
        assert data["swap"]["how"] in ("set_policy", "pool-claim"), data["swap"]
    assert data["passed"] == all(p["passed"] for p in data["probes"])
    assert data["escaped"] == [p["name"] for p in data["probes"] if p["escaped"]]

    for hit in data["target_hits"]:
        assert {"target", "hit", "port", "peer"} <= set(hit) <= set(doc["target_hits"][0]), hit
        assert hit["target"] in ("allowed", "recorder"), hit
    for hit in data["host_hits"]:
        assert set(hit) == {"proto", "port", "peer"} and hit["proto"] in ("tcp", "udp"), hit
    fields, via = documented_decision()
    for decision in data["decisions"]:
        assert {"ts", "origin", "decision", "reason"} <= set(decision) <= fields, decision
        Decision.model_validate(decision)
        assert decision.get("via", "connect") in via, decision
        if "address" in decision:
            assert decision["decision"] == "allow", decision
    return report


def check_model_is_documented() -> None:
    """The document names exactly the models' fields: the report's (plus the derived ``passed`` and
    ``escaped``), a probe's and a gateway decision's."""
    doc = documented_report()
    assert set(doc) == set(AuditReport.model_fields) | {"passed", "escaped"}
    assert set(doc["probes"][0]) == set(ProbeResult.model_fields)
    assert documented_decision()[0] == set(Decision.model_fields)


class BuiltProbes(list):
    """The probes ``run_audit`` built (a list of Probe), and ``plans``: the ProbePlan(s) it built them from."""

    plans: list[ProbePlan]


def record_probe_list(monkeypatch) -> BuiltProbes:
    """Make ``run_audit`` keep the probe list it builds (``controller.audit.probes.build_probes``) and its
    plan; returns the list it fills. A report holds one result per listed probe, in order, then the summary
    probes."""
    built = BuiltProbes()
    built.plans = []
    build = controller.audit.probes.build_probes

    def recording(plan: ProbePlan) -> list[Probe]:
        probes = build(plan)
        built.extend(probes)
        built.plans.append(plan)
        return probes

    monkeypatch.setattr(controller.audit.probes, "build_probes", recording)
    return built


def expected_probe_names(built: list[Probe]) -> list[str]:
    """Every probe name a report of the run that built ``built`` must hold, in order."""
    return [p.name for p in built] + documented_categories()["summary"]


@cache
def documented_console_count() -> tuple[int, int]:
    """``(a, b)`` of the ``console`` group's documented size, ``a·h + b`` probes for ``h`` host addresses."""
    text = " ".join(_between("- `console`:", "- `summary`:").split())
    m = re.search(r"With `h` host addresses: `(\d+)h \+ (\d+)` probes", text)
    assert m, "docs/audit.md no longer states the console group's size"
    return int(m.group(1)), int(m.group(2))


CONSOLE_REFUSED = {"refused", "timeout", "unreachable", "error", "status:403"}
"""What a guest's ``console`` probe may observe (the gateway's 403 only with its own body: the judge)."""


def check_console_probes(data: dict[str, Any], host_ips: Sequence[str], port: int) -> list[dict[str, Any]]:
    """Assert that a report (parsed JSON) aimed the ``console`` group at the console on 127.0.0.1:``port``
    exactly as docs/audit.md says for a sandbox whose host addresses are ``host_ips`` — as many probes as
    the documented formula, every way named, each refused — and that the positive control reached the
    console from the host; return the group's probes."""
    a, b = documented_console_count()
    probes = [p for p in data["probes"] if p["category"] == "console"]
    names = {p["name"] for p in probes}
    assert len(probes) == a * len(host_ips) + b, (len(probes), len(host_ips), sorted(names))
    wanted = {f"console-{way}-{ip}:{port}" for ip in host_ips for way in ("tcp", "proxy", "connect")}
    wanted |= {f"console-{way}-{form}:{port}" for way in ("proxy", "connect")
               for form in ("127.0.0.1", "localhost", "[::1]", "2130706433", "0x7f000001", "[::ffff:127.0.0.1]",
                            "0", "0.0.0.0", "host.docker.internal")}
    wanted |= {f"console-tcp-127.0.0.1:{port}", f"console-tcp-host.docker.internal:{port}"}
    assert wanted <= names, sorted(wanted - names)
    for p in probes:
        assert p["expected"] == "blocked" and p["target"].startswith("console ") and str(port) in p["target"], p
        assert p["passed"] and not p["escaped"] and p["observed"] in CONSOLE_REFUSED, p
        if p["name"].startswith(("console-proxy-", "console-connect-")):
            assert p["observed"] == "status:403", p  # the gateway answered, and refused
    control = next(p for p in data["probes"] if p["name"] == "console-reachable-from-host")
    assert control["category"] == "summary" and control["expected"] == "allowed", control
    assert control["target"] == f"console 127.0.0.1:{port} from the host", control
    assert control["passed"] and control["observed"] == "status:401", control  # the console's own refusal
    assert [control["detail"][k]["detail"]["code"] for k in ("before", "after")] == ["unauthenticated"] * 2
    return probes


def console_port(data: dict[str, Any]) -> int:
    """The console's port, as the positive control's target (``console 127.0.0.1:PORT from the host``)
    names it in a report (parsed JSON)."""
    control = next(p for p in data["probes"] if p["name"] == "console-reachable-from-host")
    m = re.fullmatch(r"console 127\.0\.0\.1:(\d+) from the host", control["target"])
    assert m, control
    return int(m.group(1))
