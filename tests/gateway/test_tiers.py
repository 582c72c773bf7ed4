"""Mode ``ask`` of the egress policy: origin patterns, the tiers' validation and the order of checks
(pure: no proxy, no traffic; names resolve through a fake resolver)."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from pydantic import ValidationError

from controller.gateway.policy import Decision, NetworkPolicy, Origin, PolicyError
from controller.gateway.tiers import (
    DEFAULT_HOLD_TIMEOUT_S, DEFAULT_MAX_PENDING, DEFAULT_QUIET, OriginPattern,
)

PUBLIC = "93.184.215.14"  # a public address; nothing is sent to it


def resolver(mapping: dict[str, list[str]]):
    calls: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        if host not in mapping:
            raise socket.gaierror(socket.EAI_NONAME, "not known")
        return mapping[host]

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


def ask(**fields) -> NetworkPolicy:
    return NetworkPolicy.model_validate({"mode": "ask", **fields})


# ------------------------------------------------------------------------------------------ patterns


@pytest.mark.parametrize("pattern, origin, matches", [
    ("*", "https://anything.test", True),
    ("*", "http://10.0.0.1:8080", True),
    ("https://*.example.com", "https://a.example.com", True),
    ("https://*.example.com", "https://a.b.example.com", True),
    ("https://*.example.com", "https://A.Example.COM.", True),
    ("https://*.example.com", "https://example.com", False),
    ("https://*.example.com", "https://badexample.com", False),
    ("https://*.example.com", "https://example.com.evil.test", False),
    ("https://*.example.com", "https://a.example.com.evil.test", False),
    ("https://*.example.com", "http://a.example.com", False),
    ("https://*.example.com", "https://a.example.com:8443", False),
    ("https://*.example.com:*", "https://a.example.com:8443", True),
    ("http://host.test:8080", "http://host.test:8080", True),
    ("http://host.test:8080", "http://host.test", False),
    ("http://host.test:8080", "http://sub.host.test:8080", False),
    ("https://*.bücher.example", "https://shop.xn--bcher-kva.example", True),
    ("https://[2001:db8::1]", "https://[2001:db8::1]:443", True),
])
def test_patterns_match_whole_labels_scheme_and_port(pattern, origin, matches):
    assert OriginPattern.parse(pattern).matches(Origin.from_url(origin)) is matches


@pytest.mark.parametrize("text", [
    "", "**", "https://*", "https://a*.example.com", "https://*example.com", "https://a.*.example.com",
    "https://example.*", "ftp://*.example.com", "https://*.1.2.3.4", "https://*.[::1]", "https://user@*.a.test",
    "https://*.a.test/path", "https://*.a.test:80:*", "https://a.test:*:*", "*.example.com", "https://",
    "https://*.a.test:99999", "https://bad host.test", 5, None,
])
def test_malformed_patterns_are_refused(text):
    with pytest.raises(PolicyError):
        OriginPattern.parse(text)


def test_patterns_are_canonicalised_on_load():
    policy = ask(ask=["HTTPS://*.Example.COM:443/", "https://*.example.com", "http://H.test:80", "*"],
                 quiet=["https://x.test:*"])
    assert policy.ask == ("https://*.example.com", "http://h.test", "*")
    assert policy.quiet == ("https://x.test:*",)


# ------------------------------------------------------------------------------------------ validation


def test_mode_ask_fills_its_defaults_and_old_modes_dump_as_before():
    policy = ask()
    assert policy.ask == ("*",) and policy.quiet == DEFAULT_QUIET
    assert policy.hold_timeout_s == DEFAULT_HOLD_TIMEOUT_S and policy.max_pending == DEFAULT_MAX_PENDING
    assert NetworkPolicy.model_validate(policy.model_dump(mode="json")) == policy
    assert ask(quiet=[]).quiet == ()
    old = NetworkPolicy(mode="allowlist", allow=["https://a.test"])
    assert old.model_dump(mode="json") == {"mode": "allowlist", "allow": ["https://a.test"], "allow_addresses": []}
    assert NetworkPolicy().model_dump(mode="json") == {"mode": "deny-all", "allow": [], "allow_addresses": []}


@pytest.mark.parametrize("mode", ["deny-all", "allowlist"])
@pytest.mark.parametrize("field, value", [("ask", ["*"]), ("quiet", []), ("hold_timeout_s", 5), ("max_pending", 2)])
def test_ask_fields_are_only_valid_with_mode_ask(mode, field, value):
    with pytest.raises(ValidationError, match=f"{field}: only valid with mode"):
        NetworkPolicy.model_validate({"mode": mode, field: value})


@pytest.mark.parametrize("fields", [
    {"hold_timeout_s": 0}, {"hold_timeout_s": -1}, {"hold_timeout_s": 601}, {"hold_timeout_s": "5"},
    {"hold_timeout_s": True}, {"hold_timeout_s": float("nan")}, {"max_pending": 0}, {"max_pending": 101},
    {"max_pending": 2.0}, {"max_pending": "3"}, {"ask": "*"}, {"ask": ["https://*.a*.test"]}, {"quiet": [7]},
    {"mode": "prompt"},
])
def test_malformed_ask_fields_are_refused(fields):
    with pytest.raises(ValidationError):
        ask(**fields)


def test_policy_file_in_mode_ask(tmp_path):
    path = tmp_path / "task.toml"
    path.write_text('name = "t"\ninstructions = "i"\n[network]\nmode = "ask"\nallow = ["http://127.0.0.1:8080"]\n'
                    'ask = ["https://*.python.org"]\nquiet = []\nhold_timeout_s = 12.5\nmax_pending = 2\n')
    policy = NetworkPolicy.from_toml(path)
    assert (policy.mode, policy.ask, policy.quiet, policy.hold_timeout, policy.pending_limit) == (
        "ask", ("https://*.python.org",), (), 12.5, 2)


# ---------------------------------------------------------------------------------------- order of checks


def reason(policy: NetworkPolicy, url: str, mapping: dict[str, list[str]] | None = None, **kwargs) -> str:
    origin = Origin.from_url(url)
    verdict = policy.evaluate(origin.scheme, origin.host, origin.port, resolver=resolver(mapping or {}), **kwargs)
    return verdict.decision.reason if verdict.action != "ask" else "ask"


def test_tiers_in_order():
    policy = ask(allow=["https://allowed.test"], ask=["https://*.ask.test", "https://quiet.test"],
                 quiet=["https://quiet.test", "https://*.ask.test:8443"])
    names = {n: [PUBLIC] for n in ("allowed.test", "a.ask.test", "quiet.test")}
    assert reason(policy, "https://allowed.test", names) == "allowlisted"
    assert reason(policy, "https://a.ask.test", names) == "ask"
    assert reason(policy, "https://quiet.test", names) == "quiet"  # quiet comes before ask
    assert reason(policy, "https://a.ask.test:8443", names) == "quiet"
    assert reason(policy, "https://other.test", names) == "policy"
    remembered = {Origin.parse("https://a.ask.test"): ("denied", "oreq_x")}
    verdict = policy.evaluate("https", "a.ask.test", 443, resolver=resolver(names), memory=remembered.get)
    assert (verdict.action, verdict.decision.reason, verdict.decision.request_id) == ("deny", "denied_earlier", "oreq_x")
    remembered = {Origin.parse("https://a.ask.test"): ("approved", "oreq_y")}
    verdict = policy.evaluate("https", "a.ask.test", 443, resolver=resolver(names), memory=remembered.get)
    assert (verdict.action, verdict.decision.reason, verdict.address) == ("allow", "approved_earlier", PUBLIC)


def test_hard_refusals_come_before_every_tier_and_no_answer_lifts_them():
    policy = ask(allow=["http://10.0.0.5"], ask=["*"], quiet=[])
    approved = {Origin.parse("https://inside.test"): ("approved", "oreq_z")}
    for url, names in [("http://10.0.0.5", {}), ("https://inside.test", {"inside.test": ["10.1.2.3"]}),
                       ("https://127.1", {}), ("https://[::ffff:169.254.169.254]", {}),
                       ("https://mixed.test", {"mixed.test": [PUBLIC, "192.168.1.1"]})]:
        assert reason(policy, url, names, memory=approved.get) == "address_refused", url
    verdict = policy.evaluate("https", "inside.test", 443, resolver=resolver({"inside.test": ["10.1.2.3"]}),
                              memory=approved.get)
    assert verdict.decision.detail == "10.1.2.3 (private)"


def test_an_address_rule_lifts_the_address_check_but_never_the_gateways_own_endpoints():
    policy = ask(ask=["*"], allow_addresses=["127.0.0.0/8"])

    def own(address, port) -> bool:
        return address == ipaddress.ip_address("127.0.0.1") and port in (3128, 8001)

    assert reason(policy, "http://127.0.0.1:8080", own_endpoint=own) == "ask"
    for url in ("http://127.0.0.1:3128", "https://127.0.0.1:8001", "http://[::ffff:127.0.0.1]:8001"):
        assert reason(policy, url, own_endpoint=own) == "address_refused", url
    assert reason(policy, "https://loop.test:8001", {"loop.test": ["127.0.0.1"]}, own_endpoint=own) == "address_refused"
    old = NetworkPolicy(mode="allowlist", allow=["http://127.0.0.1:3128"], allow_addresses=["127.0.0.1"])
    decision = old.decide("http", "127.0.0.1", 3128, own_endpoint=own)
    assert not decision.allowed and decision.reason.startswith("address-refused:")


def test_names_outside_every_tier_are_never_resolved():
    policy = ask(ask=["https://*.ask.test"], quiet=["https://quiet.test"])
    lookups = resolver({})
    for host in ("other.test", "quiet.test", "ask.test"):
        policy.evaluate("https", host, 443, resolver=lookups)
    assert lookups.calls == []
    policy.evaluate("https", "a.ask.test", 443, resolver=lookups)
    assert lookups.calls == ["a.ask.test"]


def test_an_ask_tier_name_that_does_not_resolve_is_refused_without_asking():
    verdict = ask().evaluate("https", "nowhere.test", 443, resolver=resolver({}))
    assert verdict.action == "deny" and verdict.decision.reason.startswith("resolve-failed")


def test_old_modes_keep_their_meaning():
    names = {"a.test": [PUBLIC]}
    allowlist = NetworkPolicy(mode="allowlist", allow=["https://a.test"])
    assert reason(allowlist, "https://a.test", names) == "allowlisted"
    assert reason(allowlist, "https://b.test", names) == "not-allowlisted"
    assert reason(NetworkPolicy(), "https://a.test", names) == "deny-all"
    assert allowlist.decide("https", "a.test", 443, resolver=resolver(names)).address == PUBLIC


def test_decide_in_mode_ask_never_allows_what_needs_a_person():
    decision = ask().decide("https", "a.test", 443, resolver=resolver({"a.test": [PUBLIC]}))
    assert (decision.decision, decision.reason) == ("deny", "ask")


def test_decision_lines_of_older_gateways_still_read_and_new_fields_round_trip():
    old = Decision.model_validate_json('{"ts": "t", "origin": "https://a.test", "decision": "deny", '
                                       '"reason": "not-allowlisted", "via": "connect"}')
    assert old.request_id is None and old.held_ms is None and old.detail is None
    new = Decision(origin="https://a.test", decision="allow", reason="approved", request_id="oreq_a", held_ms=1200)
    line = new.model_dump_json(exclude_none=True)
    assert Decision.model_validate_json(line) == new and "detail" not in line
