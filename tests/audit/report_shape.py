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
from typing import Any

import controller.audit.probes
from controller.audit import AuditReport, Probe, ProbePlan, ProbeResult
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
    summary = [p["name"] for p in data["probes"] if p["category"] == "summary"]
    assert summary == categories["summary"], summary
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


def record_probe_list(monkeypatch) -> list[Probe]:
    """Make ``run_audit`` keep the probe list it builds (``controller.audit.probes.build_probes``); returns the
    list it fills. A report holds one result per listed probe, in order, then the summary probes."""
    built: list[Probe] = []
    build = controller.audit.probes.build_probes

    def recording(plan: ProbePlan) -> list[Probe]:
        probes = build(plan)
        built.extend(probes)
        return probes

    monkeypatch.setattr(controller.audit.probes, "build_probes", recording)
    return built


def expected_probe_names(built: list[Probe]) -> list[str]:
    """Every probe name a report of the run that built ``built`` must hold, in order."""
    return [p.name for p in built] + documented_categories()["summary"]
