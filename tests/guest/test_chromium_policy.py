"""The proxy routes of the agent's chromium (guest/chromium_policy.py, wire/browser_tools.py
``GuestUrlRule.direct_hosts``): which guest-local services it reaches without the gateway, as written
into the managed policy file the image links to. The real chromium reading them runs in Docker
(tests/docker/test_browser_rule.py); here the file itself: what it holds for each spelling of a local
origin, what is never in it, and that only a directory of the agent's own takes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guest.browser import BrowserHost
from guest.browser_tools import BrowserTools
from guest.chromium_policy import ProxyRoutes
from guest.launch import LaunchError
from wire.browser_tools import GuestUrlRule

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "images" / "chromium" / "policies.json"


def test_the_static_policy_sends_everything_through_the_gateway():
    """Before any rule: loopback is not chromium's implicit direct route, and WebRTC has no path past the proxy."""
    policy = json.loads(STATIC.read_text())
    assert policy["ProxySettings"] == {"ProxyMode": "fixed_servers", "ProxyServer": "gateway:3128",
                                       "ProxyBypassList": "<-loopback>"}
    assert policy["WebRtcIPHandling"] == "disable_non_proxied_udp"


@pytest.mark.parametrize("origin, host", [
    ("http://127.0.0.1:8080", "127.0.0.1:8080"), ("http://127.1:8080", "127.0.0.1:8080"),
    ("http://0x7f.1:8080", "127.0.0.1:8080"), ("http://2130706433:8080/", "127.0.0.1:8080"),
    ("http://[::1]:81", "[::1]:81"), ("http://[0:0::1]:81", "[::1]:81"), ("http://LOCALHOST.:9000", "localhost:9000"),
    ("https://api.localhost", "api.localhost:443"), ("http://127.0.0.2", "127.0.0.2:80"),
    ("http://[fe80::1]:7", "[fe80::1]:7"), ("http://169.254.1.2:7", "169.254.1.2:7"),
])
def test_each_spelling_of_a_local_origin_is_one_host_as_chromium_names_it(origin, host):
    assert GuestUrlRule(local_origins=[origin]).direct_hosts() == [host]


def test_the_agents_port_and_names_that_would_be_more_rules_are_never_direct():
    rule = GuestUrlRule(local_origins=["http://127.0.0.1:8000", "http://[::1]:8000", "http://a,b.localhost:1",
                                       "http://x;y.localhost:1", "http://*.localhost:1", "http://127.0.0.1:8080"],
                        agent_port=8000)
    assert rule.direct_hosts(["http://localhost:8000/", "http://127.1:8080", "http://localhost:3000"]) == \
        ["127.0.0.1:8080", "localhost:3000"]


def routes_in(tmp_path: Path, static: dict | None = None) -> ProxyRoutes:
    policy = tmp_path / "static.json"
    policy.write_text(json.dumps(static) if static is not None else STATIC.read_text())
    return ProxyRoutes(str(tmp_path / "routes" / "proxy.json"), str(policy))


def test_the_routes_file_is_the_static_proxy_with_the_direct_hosts_added(tmp_path):
    routes = routes_in(tmp_path)
    routes.write(["127.0.0.1:8080", "localhost:3000"])
    written = json.loads(routes.path.read_text())
    assert written == {"ProxySettings": {"ProxyMode": "fixed_servers", "ProxyServer": "gateway:3128",
                                         "ProxyBypassList": "<-loopback>,127.0.0.1:8080,localhost:3000"}}
    assert oct(routes.path.stat().st_mode & 0o777) == "0o644"
    assert oct(routes.path.parent.stat().st_mode & 0o777) == "0o755"
    routes.write([])
    assert json.loads(routes.path.read_text())["ProxySettings"]["ProxyBypassList"] == "<-loopback>"
    assert sorted(p.name for p in routes.path.parent.iterdir()) == ["proxy.json"]  # nothing left aside


@pytest.mark.parametrize("static", [{}, {"ProxySettings": {"ProxyMode": "direct"}},
                                    {"ProxySettings": {"ProxyMode": "fixed_servers"}}, {"ProxySettings": "x"}])
def test_a_static_policy_without_a_fixed_proxy_writes_nothing(tmp_path, static):
    routes = routes_in(tmp_path, static)
    with pytest.raises(OSError, match="sets no fixed proxy"):
        routes.write(["127.0.0.1:8080"])
    assert not routes.path.exists()


@pytest.mark.parametrize("problem", ["others-write", "group-write", "a-link"])
def test_a_directory_others_may_write_takes_no_routes(tmp_path, problem):
    routes = routes_in(tmp_path)
    if problem == "a-link":
        (tmp_path / "elsewhere").mkdir(mode=0o755)
        routes.path.parent.symlink_to(tmp_path / "elsewhere")
    else:
        routes.path.parent.mkdir()
        routes.path.parent.chmod(0o757 if problem == "others-write" else 0o775)
    with pytest.raises(OSError, match="not a directory only the agent writes"):
        routes.write(["127.0.0.1:8080"])
    assert not routes.path.exists() and not (tmp_path / "elsewhere" / "proxy.json").exists()


def test_launching_chromium_writes_the_rules_and_the_launchs_origins(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENT_BROWSER_POLICY", raising=False)
    assert BrowserTools(BrowserHost()).routes is None  # a local agent: no managed policy to extend
    routes = routes_in(tmp_path)
    tools = BrowserTools(BrowserHost(), routes=routes)
    tools.set_rule(GuestUrlRule(local_origins=["http://127.0.0.1:9000"], agent_port=8000))
    tools.launching(["http://localhost:8080/app?x=1", "https://example.test/", "--flag", "http://127.0.0.1:8000/"])
    bypass = json.loads(routes.path.read_text())["ProxySettings"]["ProxyBypassList"]
    assert bypass == "<-loopback>,127.0.0.1:9000,localhost:8080"


def test_a_launch_whose_routes_cannot_be_written_is_refused(tmp_path):
    routes = routes_in(tmp_path, {})
    with pytest.raises(LaunchError) as caught:
        BrowserTools(BrowserHost(), routes=routes).launching(["http://127.0.0.1:9000/"])
    assert (caught.value.status, caught.value.code) == (400, "launch_failed")
    assert "proxy routes" in caught.value.message


def test_the_environment_names_the_routes_file(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENT_BROWSER_POLICY", str(tmp_path / "proxy.json"))
    assert ProxyRoutes.from_env().path == tmp_path / "proxy.json"
    monkeypatch.setenv("AGENT_BROWSER_POLICY", "relative/proxy.json")
    assert ProxyRoutes.from_env() is None
