"""Origin matching, IP-literal parsing and address classification of the egress policy."""

from __future__ import annotations

import ipaddress
import json
import socket

import pytest
from pydantic import ValidationError

from controller.gateway.policy import (
    Decision,
    NetworkPolicy,
    Origin,
    PolicyError,
    canonical_host,
    destination_mismatch,
    classify_address,
    parse_ip_literal,
    parse_ipv4_literal,
    system_resolver,
)

PUBLIC_V4 = "93.184.215.14"  # a public address; tests resolve with a fake resolver, no traffic is sent
PUBLIC_V6 = "2606:2800:21f:cb07:6820:80da:af6b:8b2c"


def fixed_resolver(mapping: dict[str, list[str]]):
    calls: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> list[str]:
        calls.append((host, port))
        if host not in mapping:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return mapping[host]

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


def allowlist(*origins: str, addresses: tuple[str, ...] = ()) -> NetworkPolicy:
    return NetworkPolicy(mode="allowlist", allow=list(origins), allow_addresses=list(addresses))


# ---------------------------------------------------------------------------------------------- origins


@pytest.mark.parametrize(
    "text, expected",
    [
        ("https://example.com", ("https", "example.com", 443)),
        ("https://example.com/", ("https", "example.com", 443)),
        ("https://EXAMPLE.com.", ("https", "example.com", 443)),
        ("HTTPS://Example.COM:443", ("https", "example.com", 443)),
        ("https://example.com:8443", ("https", "example.com", 8443)),
        ("http://example.com", ("http", "example.com", 80)),
        ("http://example.com:80", ("http", "example.com", 80)),
        ("https://bücher.example", ("https", "xn--bcher-kva.example", 443)),
        ("https://BÜCHER.example", ("https", "xn--bcher-kva.example", 443)),
        ("https://xn--bcher-kva.example", ("https", "xn--bcher-kva.example", 443)),
        ("http://[::1]:8080", ("http", "::1", 8080)),
        ("http://10.0.0.5:8080", ("http", "10.0.0.5", 8080)),
        ("http://0x0a.0.0.5:8080", ("http", "10.0.0.5", 8080)),
    ],
)
def test_origin_parse_canonicalises(text, expected):
    origin = Origin.parse(text)
    assert (origin.scheme, origin.host, origin.port) == expected


@pytest.mark.parametrize(
    "text",
    [
        "example.com",
        "https://",
        "https://example.com/path",
        "https://example.com?q=1",
        "https://example.com#frag",
        "https://user@example.com",
        "https://example.com@evil.test",
        "https://*.example.com",
        "https://example.com:",
        "https://example.com:0",
        "https://example.com:65536",
        "https://example.com:44a",
        "https://example.com: 443",
        "ftp://example.com",
        "https://exa mple.com",
        "https://example..com",
        "https://-bad.example",
        "https://ex%61mple.com",
        "https://ex\\ample.com",
        "http://::1",
        "http://[::1",
        "http://[fe80::1%25eth0]",
        "http://256.1.1.1",
        "http://4294967296",
        "http://08.1.1.1",
        "http://example.123",
        42,
    ],
)
def test_origin_parse_rejects(text):
    with pytest.raises(PolicyError):
        Origin.parse(text)


def test_origin_str_round_trips_and_omits_default_port():
    assert str(Origin.parse("https://Example.com:443")) == "https://example.com"
    assert str(Origin.parse("https://example.com:8443")) == "https://example.com:8443"
    assert str(Origin.parse("http://[::1]:80")) == "http://[::1]"
    for text in ["https://example.com", "https://example.com:8443", "http://[2001:db8::1]:81"]:
        assert str(Origin.parse(str(Origin.parse(text)))) == str(Origin.parse(text))


def test_origin_from_url_ignores_userinfo_and_path():
    assert Origin.from_url("https://example.com@evil.test/x?y") == Origin("https", "evil.test", 443)
    assert Origin.from_url("https://example.com.evil.test/") == Origin("https", "example.com.evil.test", 443)
    assert Origin.from_url("http://0177.0.0.1:8080/") == Origin("http", "127.0.0.1", 8080)
    with pytest.raises(PolicyError):
        Origin.from_url("https://example.com:99999/")
    with pytest.raises(PolicyError):
        Origin.from_url("/relative/path")


# ------------------------------------------------------------------------------------ exact matching

LOOKALIKES = [
    "https://example.com.evil.test",
    "https://example.com@evil.test",
    "https://example.computer.com",
    "http://example.com",
    "https://example.com:8443",
    "https://www.example.com",
    "https://example.co",
    "https://xample.com",
    "https://example.com.",  # same origin: must be admitted (trailing dot stripped) -> checked below
]


@pytest.mark.parametrize("url", LOOKALIKES[:-1])
def test_allowlist_never_matches_by_prefix(url):
    policy = allowlist("https://example.com")
    origin = Origin.from_url(url)
    assert not policy.admits_origin(origin), url
    resolver = fixed_resolver({"example.com": [PUBLIC_V4], "evil.test": [PUBLIC_V4],
                               "example.com.evil.test": [PUBLIC_V4], "example.computer.com": [PUBLIC_V4],
                               "www.example.com": [PUBLIC_V4], "example.co": [PUBLIC_V4],
                               "xample.com": [PUBLIC_V4]})
    decision = policy.decide(origin.scheme, origin.host, origin.port, resolver=resolver)
    assert decision.decision == "deny"
    assert decision.reason == "not-allowlisted"
    assert resolver.calls == [], "a denied origin must not even be resolved"


@pytest.mark.parametrize(
    "scheme, host, port",
    [
        ("https", "example.com", 443),
        ("https", "EXAMPLE.COM", 443),
        ("https", "example.com.", 443),
        ("HTTPS", "Example.Com", None),
    ],
)
def test_allowlist_admits_exact_origin_in_any_spelling(scheme, host, port):
    resolver = fixed_resolver({"example.com": [PUBLIC_V4, PUBLIC_V6]})
    decision = allowlist("https://example.com").decide(scheme, host, port, client="10.1.0.2:5555", resolver=resolver)
    assert decision.decision == "allow", decision
    assert decision.address == PUBLIC_V4
    assert decision.origin == "https://example.com"
    assert decision.client == "10.1.0.2:5555"
    assert resolver.calls == [("example.com", 443)]


def test_idna_origin_matches_unicode_and_punycode_spellings():
    policy = allowlist("https://bücher.example")
    resolver = fixed_resolver({"xn--bcher-kva.example": [PUBLIC_V4]})
    assert policy.decide("https", "xn--bcher-kva.example", 443, resolver=resolver).allowed
    assert policy.decide("https", "BÜCHER.example", 443, resolver=resolver).allowed
    assert not policy.decide("https", "bucher.example", 443, resolver=resolver).allowed


def test_deny_all_denies_everything_without_resolving():
    resolver = fixed_resolver({"example.com": [PUBLIC_V4]})
    policy = NetworkPolicy()
    assert policy.mode == "deny-all"
    for host in ["example.com", PUBLIC_V4, "127.0.0.1"]:
        decision = policy.decide("https", host, 443, resolver=resolver)
        assert (decision.decision, decision.reason) == ("deny", "deny-all")
    assert resolver.calls == []


# ------------------------------------------------------------------------------------------ literals

LOOPBACK_FORMS = [
    "127.0.0.1",
    "2130706433",
    "0x7f000001",
    "0X7F000001",
    "0177.0.0.1",
    "0177.0000.0000.0001",
    "017700000001",
    "127.1",
    "127.0.1",
    "0x7f.1",
    "0x7f.0.0.1",
    "0x7f.0x0.0x0.0x1",
    "127.0x0.01",
    "127.0.0.1.",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
    "[::1]",
    "::1",
    "[0000::0001]",
]


@pytest.mark.parametrize("form", LOOPBACK_FORMS)
def test_every_loopback_literal_form_is_recognised(form):
    address = parse_ip_literal(form)
    assert address is not None
    assert ipaddress.ip_address(canonical_host(form)) == address
    unmapped = address.ipv4_mapped if address.version == 6 and address.ipv4_mapped else address
    assert unmapped.is_loopback


@pytest.mark.parametrize(
    "form, expected",
    [
        ("169.254.169.254", "169.254.169.254"),
        ("2852039166", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("0251.0376.0251.0376", "169.254.169.254"),
        ("169.254.43518", "169.254.169.254"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
        ("10.1", "10.0.0.1"),
        ("0", "0.0.0.0"),
        ("0x0", "0.0.0.0"),
        ("192.168.1", "192.168.0.1"),
    ],
)
def test_ipv4_literal_forms(form, expected):
    assert str(parse_ipv4_literal(form)) == expected


@pytest.mark.parametrize("form", ["example.com", "1.example.com", "0day.example", "", "1.2.3.4.5", "a.1"])
def test_names_are_not_ipv4_literals(form):
    assert parse_ipv4_literal(form) is None


@pytest.mark.parametrize("form", ["256.0.0.1", "1.2.3.256", "1.2.65536", "4294967296", "0x100000000", "09.1.1.1"])
def test_overflowing_numeric_hosts_raise(form):
    with pytest.raises(PolicyError):
        parse_ipv4_literal(form)


def test_ipv4_literal_matches_socket_inet_aton():
    for form in ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0x7f.1", "127.0.1", "10.1", "1.2.3.4"]:
        assert str(parse_ipv4_literal(form)) == socket.inet_ntoa(socket.inet_aton(form)), form


# ------------------------------------------------------------------------------------ classification


@pytest.mark.parametrize(
    "address, category",
    [
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("fc00::1", "private"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "cgnat"),
        ("100.127.255.254", "cgnat"),
        ("169.254.169.254", "metadata"),
        ("169.254.170.2", "metadata"),
        ("100.100.100.200", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("0.1.2.3", "reserved"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("::ffff:127.0.0.1", "ipv4-mapped"),
        ("::ffff:8.8.8.8", "ipv4-mapped"),
        ("::127.0.0.1", "embedded-ipv4"),
        ("64:ff9b::7f00:1", "embedded-ipv4"),
        ("2002:7f00:1::1", "embedded-ipv4"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "embedded-ipv4"),
        ("192.0.2.1", "reserved"),
        ("198.18.0.1", "reserved"),
        ("2001:db8::1", "reserved"),
        ("192.0.0.8", "reserved"),
        ("203.0.113.9", "reserved"),
        ("3fff::1", "reserved"),
        ("4000::1", "reserved"),
        ("::2", "embedded-ipv4"),
    ],
)
def test_special_addresses_are_classified(address, category):
    assert classify_address(ipaddress.ip_address(address)) == category


@pytest.mark.parametrize("address", [PUBLIC_V4, "8.8.8.8", "1.1.1.1", PUBLIC_V6, "2001:4860:4860::8888"])
def test_public_addresses_are_ordinary(address):
    assert classify_address(ipaddress.ip_address(address)) is None


# ---------------------------------------------------------------------------- decisions on addresses


@pytest.mark.parametrize("form", LOOPBACK_FORMS + ["169.254.169.254", "2852039166", "[fd00:ec2::254]", "10.1"])
def test_ip_literal_origins_are_refused_even_when_allowlisted(form):
    host = canonical_host(form)
    bracketed = f"[{host}]" if ":" in host else host
    policy = allowlist(f"http://{bracketed}:8080")
    decision = policy.decide("http", form, 8080, resolver=fixed_resolver({}))
    assert decision.decision == "deny"
    assert decision.reason.startswith("address-refused:"), decision.reason


def test_rule_naming_the_address_admits_a_literal_origin():
    policy = allowlist("http://127.0.0.1:8080", addresses=("127.0.0.1",))
    for form in ["127.0.0.1", "2130706433", "0x7f.1", "127.1"]:
        decision = policy.decide("http", form, 8080, resolver=fixed_resolver({}))
        assert decision.allowed, (form, decision)
        assert decision.address == "127.0.0.1"
    # the rule admits the address, not other origins
    assert not policy.decide("http", "127.0.0.1", 8081).allowed
    assert not policy.decide("http", "127.0.0.2", 8080).allowed
    # the mapped form names the same endpoint and is judged by the same rule
    mapped = allowlist("http://[::ffff:127.0.0.1]:8080", addresses=("127.0.0.1",))
    assert mapped.decide("http", "[::ffff:7f00:1]", 8080).allowed


def test_network_rule_never_admits_metadata_unless_exact():
    wide = allowlist("http://169.254.169.254", addresses=("169.254.0.0/16",))
    decision = wide.decide("http", "169.254.169.254", 80)
    assert (decision.decision, decision.reason) == ("deny", "address-refused: 169.254.169.254 (metadata)")
    exact = allowlist("http://169.254.169.254", addresses=("169.254.169.254",))
    assert exact.decide("http", "169.254.169.254", 80).allowed


def test_name_resolving_to_any_refused_address_is_denied():
    policy = allowlist("https://example.com")
    for bad in ["127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "::ffff:127.0.0.1", "100.64.1.1", "0.0.0.0"]:
        resolver = fixed_resolver({"example.com": [PUBLIC_V4, bad]})
        decision = policy.decide("https", "example.com", 443, resolver=resolver)
        assert decision.decision == "deny", bad
        assert decision.reason.startswith(f"address-refused: {ipaddress.ip_address(bad)} ("), decision.reason


def test_name_resolving_to_named_private_address_is_allowed_and_pinned():
    policy = allowlist("http://app.internal:8080", addresses=("172.30.5.0/24",))
    resolver = fixed_resolver({"app.internal": ["172.30.5.7"]})
    decision = policy.decide("http", "app.internal", 8080, resolver=resolver)
    assert decision.allowed and decision.address == "172.30.5.7"
    resolver = fixed_resolver({"app.internal": ["172.30.5.7", "172.30.6.1"]})
    assert not policy.decide("http", "app.internal", 8080, resolver=resolver).allowed


def test_resolution_failure_is_a_deny():
    policy = allowlist("https://nowhere.test")
    decision = policy.decide("https", "nowhere.test", 443, resolver=fixed_resolver({}))
    assert decision.decision == "deny" and decision.reason.startswith("resolve-failed")
    empty = policy.decide("https", "nowhere.test", 443, resolver=fixed_resolver({"nowhere.test": []}))
    assert empty.reason == "resolve-failed: no addresses"


def test_system_resolver_resolves_localhost_to_loopback_and_policy_refuses_it():
    addresses = system_resolver("localhost", 80)
    assert addresses and all(ipaddress.ip_address(a).is_loopback for a in addresses)
    decision = allowlist("http://localhost").decide("http", "localhost", 80)
    assert decision.decision == "deny" and "(loopback)" in decision.reason


def test_malformed_targets_are_denied_not_raised():
    policy = allowlist("https://example.com")
    for scheme, host, port in [("https", "", 443), ("https", "exa mple.com", 443), ("gopher", "example.com", 70),
                               ("https", "example.com", 0), ("https", "256.256.256.256", 443)]:
        decision = policy.decide(scheme, host, port)
        assert decision.decision == "deny" and decision.reason.startswith("invalid-origin"), decision


def test_decision_serialises_as_one_json_line():
    decision = allowlist("https://example.com").decide(
        "https", "example.com", 443, client="10.0.0.2:4000", via="connect",
        resolver=fixed_resolver({"example.com": [PUBLIC_V4]}),
    )
    line = decision.model_dump_json(exclude_none=True)
    assert "\n" not in line
    data = json.loads(line)
    assert set(data) >= {"ts", "origin", "decision", "reason", "client"}
    assert data["decision"] == "allow" and data["via"] == "connect"
    assert Decision.model_validate(data) == decision


# --------------------------------------------------------------------------------------- policy files


def test_policy_from_task_network_table(tmp_path):
    task = tmp_path / "task.toml"
    task.write_text(
        'name = "t"\ninstructions = "x"\n[network]\nmode = "allowlist"\n'
        'allow = ["https://Example.com:443", "https://example.com", "http://b.test:8080/"]\n'
        'allow_addresses = ["172.30.0.0/24", "[::1]"]\n'
    )
    policy = NetworkPolicy.from_toml(task)
    assert policy.allow == ("https://example.com", "http://b.test:8080")
    assert policy.allow_addresses == ("172.30.0.0/24", "::1/128")


def test_policy_file_top_level_and_default(tmp_path):
    top = tmp_path / "p.toml"
    top.write_text('mode = "allowlist"\nallow = ["https://a.test"]\n')
    assert NetworkPolicy.from_toml(top).allow == ("https://a.test",)
    none = tmp_path / "n.toml"
    none.write_text('name = "t"\n')
    assert NetworkPolicy.from_toml(none).mode == "deny-all"


@pytest.mark.parametrize(
    "data",
    [
        {"mode": "allow-all"},
        {"mode": "deny-all", "allow": ["https://a.test"]},
        {"mode": "allowlist", "allow": "https://a.test"},
        {"mode": "allowlist", "allow": ["https://a.test/path"]},
        {"mode": "allowlist", "allow_addresses": ["10.0.0.1/8"]},
        {"mode": "allowlist", "allow_addresses": ["not-an-ip"]},
        {"mode": "allowlist", "allowed": ["https://a.test"]},
    ],
)
def test_malformed_policies_are_rejected(data):
    with pytest.raises(ValidationError):
        NetworkPolicy.model_validate(data)


@pytest.mark.parametrize("body", [
    'mode = "allowlist"\nalow = ["https://a.test"]\n',  # a typo must not silently leave the list empty
    'mode = "allowlist"\nallow = ["https://a.test"]\nallow_adresses = ["10.0.0.1"]\n',
    'Mode = "allowlist"\n',
    'network = "allowlist"\n',
])
def test_policy_file_with_unknown_keys_is_rejected(tmp_path, body):
    path = tmp_path / "p.toml"
    path.write_text(body)
    with pytest.raises(ValueError):
        NetworkPolicy.from_toml(path)


@pytest.mark.parametrize("text", ["https://example.com\u3002", "https://example\u3002com\uff0e", "https://EXAMPLE.com."])
def test_trailing_dot_in_any_spelling_is_stripped(text):
    """A full stop that IDNA maps to '.' at the end of a name is the same trailing dot."""
    assert str(Origin.parse(text)) == "https://example.com"
    assert canonical_host(text.split("//", 1)[1]) == "example.com"


# ------------------------------------------------------------------------- fields naming a destination

HTTP_8099 = Origin.from_parts("http", "127.0.0.1", 8099)
IDN = Origin.from_parts("https", "b\u00fccher.example")


@pytest.mark.parametrize("origin, hosts, authority", [
    (HTTP_8099, ["127.0.0.1:8099"], None),
    (HTTP_8099, ["2130706433:8099"], None),
    (HTTP_8099, ["127.1:08099"], None),
    (HTTP_8099, ["127.0.0.1.:8099"], "127.0.0.1:8099"),
    (HTTP_8099, [], "0x7f000001:8099"),
    (Origin.from_parts("http", "example.com"), ["EXAMPLE.com."], None),
    (Origin.from_parts("http", "example.com"), ["example.COM:80"], None),
    (IDN, ["xn--bcher-kva.example"], None),
    (IDN, ["B\u00dcCHER.example.:443"], "xn--bcher-kva.example:443"),
    (Origin.from_parts("http", "[::1]", 8099), ["[0:0::1]:8099"], None),
])
def test_fields_naming_the_decided_origin_in_any_spelling_agree(origin, hosts, authority):
    assert destination_mismatch(origin, hosts=hosts, authority=authority) is None


@pytest.mark.parametrize("origin, hosts, authority, reason", [
    (HTTP_8099, ["127.0.0.2:8098"], None,
     "host-mismatch: Host 127.0.0.2:8098 names http://127.0.0.2:8098, not http://127.0.0.1:8099"),
    (HTTP_8099, ["127.0.0.1"], None, "host-mismatch: Host 127.0.0.1 names http://127.0.0.1, not http://127.0.0.1:8099"),
    (HTTP_8099, ["127.0.0.1:8099", "127.0.0.1:8099"], None, "host-mismatch: duplicate Host headers"),
    (HTTP_8099, [], None, "host-mismatch: no Host header"),
    (HTTP_8099, ["127.0.0.1:8099"], "127.0.0.2:8099", "host-mismatch: authority 127.0.0.2:8099 names"),
    (HTTP_8099, ["x@127.0.0.1:8099"], None, "host-mismatch: Host x@127.0.0.1:8099 does not parse"),
    (HTTP_8099, ["127.0.0.1:8099/"], None, "host-mismatch: Host 127.0.0.1:8099/ does not parse"),
    (HTTP_8099, ["127.0.0.1:"], None, "host-mismatch: Host 127.0.0.1: does not parse"),
    (HTTP_8099, ["127.0.0.1:80a"], None, "host-mismatch: Host 127.0.0.1:80a does not parse"),
    (HTTP_8099, ["127.0.0.1:99999"], None, "host-mismatch: Host 127.0.0.1:99999 does not parse"),
    (HTTP_8099, ["[127.0.0.1]:8099"], None, "host-mismatch: Host [127.0.0.1]:8099 does not parse"),
    (HTTP_8099, ["127.0.0.1 :8099"], None, "host-mismatch: Host 127.0.0.1 :8099 does not parse"),
    (HTTP_8099, [""], None, "host-mismatch: Host  does not parse"),
    (Origin.from_parts("http", "[::1]", 8099), ["::1:8099"], None, "host-mismatch: Host ::1:8099 does not parse"),
    (IDN, ["bucher.example"], None, "host-mismatch: Host bucher.example names https://bucher.example"),
    (IDN, ["xn--bcher-kva.example.evil.test"], None, "host-mismatch: Host xn--bcher-kva.example.evil.test names"),
    (HTTP_8099, ["x\x1b[2J\n"], None, "host-mismatch: Host x\\x1b[2J\\n does not parse"),
])
def test_fields_naming_anything_else_are_a_mismatch(origin, hosts, authority, reason):
    got = destination_mismatch(origin, hosts=hosts, authority=authority)
    assert got is not None and got.startswith(reason), got
    assert got.isprintable()


def test_a_connect_may_carry_no_host_header_but_not_a_foreign_one():
    origin = Origin.from_parts("https", "example.com", 8443)
    assert destination_mismatch(origin, hosts=[], authority="example.com:8443", host_required=False) is None
    assert destination_mismatch(origin, hosts=[], host_required=False) is None
    assert destination_mismatch(origin, hosts=["example.com"], authority="example.com:8443",
                                host_required=False).startswith("host-mismatch: Host example.com names https://example.com,")


def test_a_long_host_is_cut_in_the_reason():
    reason = destination_mismatch(HTTP_8099, hosts=["a" * 5000])
    assert reason is not None and len(reason) < 300
