"""Command-line surface of ``python -m controller.gateway serve`` (what the gateway container runs)."""

from __future__ import annotations

import json

import pytest

from controller.gateway.__main__ import main
from controller.gateway.serve import load_policy, parse_listen


def test_load_policy_from_json_toml_inline_and_default(tmp_path):
    as_json = tmp_path / "policy.json"
    as_json.write_text(json.dumps({"mode": "allowlist", "allow": ["https://Example.com:443"], "allow_addresses": []}))
    assert load_policy(str(as_json), None).allow == ("https://example.com",)
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"network": {"mode": "deny-all"}}))
    assert load_policy(str(wrapped), None).mode == "deny-all"
    task = tmp_path / "task.toml"
    task.write_text('name = "t"\n[network]\nmode = "allowlist"\nallow = ["http://a.test:8080"]\n')
    assert load_policy(str(task), None).allow == ("http://a.test:8080",)
    assert load_policy(None, '{"mode": "allowlist", "allow": ["https://b.test"]}').allow == ("https://b.test",)
    assert load_policy(None, None).mode == "deny-all"


@pytest.mark.parametrize("text, expected", [("0.0.0.0:3128", ("0.0.0.0", 3128)), ("127.0.0.1:1", ("127.0.0.1", 1)),
                                            ("[::1]:8080", ("::1", 8080)), (":3128", ("0.0.0.0", 3128))])
def test_parse_listen(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["3128", "host:", "host:port", "h:70000"])
def test_parse_listen_rejects(text):
    with pytest.raises(ValueError):
        parse_listen(text)


def test_bad_policy_exits_2_before_starting(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"mode": "allowlist", "allow": ["https://example.com/path"]}))
    assert main(["serve", "--policy", str(bad), "--port", "3128", "--decision-log", str(tmp_path / "d.jsonl")]) == 2
    assert "invalid origin" in capsys.readouterr().err
    assert main(["serve", "--policy-json", "{not json"]) == 2
    assert main(["serve", "--listen", "nonsense"]) == 2
