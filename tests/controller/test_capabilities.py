"""What each backend can do is said once, on its class, and shown as it is: the docs' table, ``up
--capabilities``; asking a backend for what it cannot do is refused at once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controller.sandbox.capabilities import FEATURES, Capabilities, CapabilityMissing
from controller.sandbox.registry import BACKENDS, capability_table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "backends.md"


def test_every_backend_declares_its_own_capabilities():
    for name, cls in BACKENDS.items():
        assert "capabilities" in cls.__dict__, f"{name} inherits its capabilities"
        assert isinstance(cls.capabilities, Capabilities)


def test_asking_for_what_a_backend_cannot_do_names_both():
    none = Capabilities()
    for feature in FEATURES:
        with pytest.raises(CapabilityMissing) as refused:
            none.require("kubernetes", feature)
        assert refused.value.feature == feature and "kubernetes" in str(refused.value)
    Capabilities(pool=True, snapshot="files").require("docker", "snapshot")
    with pytest.raises(KeyError):
        none.require("docker", "teleport")


def test_a_pool_of_a_backend_without_pools_is_refused_before_anything_starts():
    from controller.sandbox.pool import Template, WarmPool

    started = []
    with pytest.raises(CapabilityMissing):
        WarmPool(BACKENDS["kubernetes"], None, [Template()], 1, start=lambda *a: started.append(a))
    assert started == []


def _shown(value: object) -> str:
    return "yes" if value is True else "no" if value in (False, "none") else str(value)


def test_the_docs_table_is_what_the_backends_declare():
    rows = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 1 + len(FEATURES) and re.fullmatch(r"`[a-z]+`", cells[0]):
            rows[cells[0].strip("`")] = [c.split()[0].strip(",") if c else "" for c in cells[1:]]
    assert set(rows) == set(BACKENDS)
    for row in capability_table():
        expected = [_shown(row[f]) for f in FEATURES]
        shown = rows[row["backend"]]
        # the docs may say more after the value (a link, "rendered only"): the first word is the value
        for feature, want, got in zip(FEATURES, expected, shown):
            if want == "no" and row["backend"] == "kubernetes" and feature == "pool":
                assert got in ("no", "rendered"), (row["backend"], feature, got)
            else:
                assert got == want, (row["backend"], feature, got)


def test_every_cold_start_reason_the_pool_gives_is_in_its_one_list():
    from controller.sandbox import pool, pool_keeper
    from controller.sandbox.pool import COLD_REASONS

    given = set()
    for module in (pool, pool_keeper):
        text = Path(module.__file__).read_text(encoding="utf-8")
        given |= set(re.findall(r'reason(?:"\])?\s*[=:]\s*"([a-z_]+)"', text))
        given |= set(re.findall(r'"reason":\s*"([a-z_]+)"', text))
    given -= {"hit"}
    assert given and given <= set(COLD_REASONS), given - set(COLD_REASONS)
