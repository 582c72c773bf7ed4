"""Each backend's network audit by its registry name (controller/audit/backends.py): the audit looks the
backends up, the registry knows nothing of the audit, and the two tables agree."""

from __future__ import annotations

import pytest

import controller.audit
from controller.audit import audit, audit_vm
from controller.audit.backends import AUDITS, WITHOUT_AUDIT, audit_function, check_complete
from controller.sandbox.registry import backend_names


def test_every_backend_of_the_registry_has_its_audit_or_is_declared_without_one():
    assert sorted([*AUDITS, *WITHOUT_AUDIT]) == sorted(backend_names())
    check_complete(backend_names())


def test_the_docker_and_vm_backends_have_their_audits_and_kubernetes_none():
    assert audit_function("docker") is audit
    assert audit_function("vm") is audit_vm
    for name in ("kubernetes", "nope"):
        with pytest.raises(KeyError, match="no network audit for backend"):
            audit_function(name)


def test_the_lookup_reads_the_package_when_called(monkeypatch):
    # the CLI's stand-in runs (tests/audit/standin.py) replace controller.audit.audit after the import
    def stand_in(policy, *, image=None):
        raise AssertionError("not run here")

    monkeypatch.setattr(controller.audit, "audit", stand_in)
    assert audit_function("docker") is stand_in


@pytest.mark.parametrize("registered, needle", [
    ([*AUDITS, *WITHOUT_AUDIT, "new"], "backend 'new' is neither in AUDITS nor in WITHOUT_AUDIT"),
    (["docker", *WITHOUT_AUDIT], "'vm' is not a backend of the registry"),
    (list(AUDITS), "'kubernetes' is not a backend of the registry"),
])
def test_a_registry_the_tables_do_not_match_is_refused_naming_the_backend(registered, needle):
    with pytest.raises(ImportError, match=needle):
        check_complete(registered)


def test_an_audit_name_the_package_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(controller.audit, "audit_vm", None)
    with pytest.raises(ImportError, match="controller.audit has no function 'audit_vm'"):
        check_complete(backend_names())
