"""controller.gateway.relay: which addresses it listens on (no traffic; reads this host's interfaces)."""

from __future__ import annotations

import ipaddress

from controller.gateway.relay import interface_addresses, listen_addresses


def test_interface_addresses_include_loopback():
    addrs = interface_addresses()
    assert ipaddress.IPv4Address("127.0.0.1") in addrs.values()


def test_listen_addresses_skip_loopback_and_excluded_networks():
    addrs = [a for a in interface_addresses().values() if not a.is_loopback]
    everything = listen_addresses([])
    assert "127.0.0.1" not in everything
    assert sorted(map(str, addrs)) == everything
    if addrs:
        excluded = ipaddress.IPv4Network(f"{addrs[0]}/32")
        assert str(addrs[0]) not in listen_addresses([excluded])
    assert listen_addresses([ipaddress.IPv4Network("0.0.0.0/0")]) == []
