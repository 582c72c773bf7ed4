"""Offline checks of the objects of the Kubernetes agent-sandbox API (kubernetes-sigs/agent-sandbox):
``Sandbox`` (``agents.x-k8s.io/v1beta1``) and ``SandboxTemplate``, ``SandboxWarmPool``, ``SandboxClaim``
(``extensions.agents.x-k8s.io/v1beta1``), the versions its CRDs serve and store (``v1alpha1`` is still
served but deprecated). :func:`check` lists what is wrong with one object, :func:`validate` raises it.

Written from the upstream Go API types (``api/v1beta1/sandbox_types.go``,
``extensions/api/v1beta1/sandbox{template,warmpool,claim}_types.go``) and the CRDs generated from them
(``k8s/crds``): per kind the apiVersion, the fields, which are required, their types (strings, int32
with their minimum, booleans, RFC 3339 times, string maps, lists) and enums; every other field is
refused, as a structural CRD schema prunes or (``kubectl --validate=strict``) refuses it. Past the
schema: ``metadata.name`` (or ``generateName``) is required, names (and the names a reference gives) must
be DNS-1123 subdomains, label keys and values must be valid, and a pod spec needs a container.

The Kubernetes types these objects embed (``PodSpec``, NetworkPolicy ingress and egress rules,
``PersistentVolumeClaimSpec``, ``ObjectMeta``) are checked with the official ``kubernetes`` client's
models where they validate (its pydantic models, as in kubernetes 37: strict types, unknown fields
refused; the object must also read back unchanged, which refuses snake_case field names), else with
kubernetes-validate's OpenAPI schemas when it is installed (strict), else only their shape (an object;
a pod spec with a list of named containers). :func:`embedded_checker` says which is in use.

Pure: nothing is contacted. The schema is this module's own reading of the upstream definitions; the
CRDs also carry update-time rules (``volumeClaimTemplates`` immutable) and defaults, which a check of
one object cannot apply and does not.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from controller.model.errors import DesktopSandboxError
from controller.text import clean

SANDBOX_API_VERSION = "agents.x-k8s.io/v1beta1"
"""apiVersion of ``Sandbox`` (the core kind: one Pod from a pod template)."""
EXTENSIONS_API_VERSION = "extensions.agents.x-k8s.io/v1beta1"
"""apiVersion of ``SandboxTemplate``, ``SandboxWarmPool`` and ``SandboxClaim``."""

INT32_MAX = 2**31 - 1
PROBLEMS_SHOWN = 10
"""How many problems the message of :class:`AgentSandboxSchemaError` lists (all are in ``problems``)."""


class AgentSandboxSchemaError(DesktopSandboxError):
    """An object that is not a valid agent-sandbox object. ``problems``: every problem found, each
    ``"<Kind> <field path>: <what is wrong>"`` (path like ``spec.podTemplate.spec.containers[0].name``),
    escaped."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        shown = "; ".join(self.problems[:PROBLEMS_SHOWN])
        more = f" (and {len(self.problems) - PROBLEMS_SHOWN} more)" if len(self.problems) > PROBLEMS_SHOWN else ""
        super().__init__(f"not a valid agent-sandbox object: {shown}{more}")


# -- the schema's building blocks ------------------------------------------------------------------------

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(value), type(value).__name__)


def _dns_subdomain_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
        return (f"{clean(value, 80)!s} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', "
                "at most 253 characters, a letter or digit at each end)")
    return None


def _label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"label key {clean(key, 80)}: its prefix is not a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        return f"label key {clean(key, 80)} is not a valid label name"
    return None


def _label_value_problem(value: str) -> str | None:
    if len(value) > 63 or not _LABEL_NAME.fullmatch(value):
        return (f"label value {clean(value, 80)} is not valid (at most 63 letters, digits, '-', '_' or '.', "
                "a letter or digit at each end)")
    return None


class _Node:
    """One field's type: :meth:`check` appends ``(path, message)`` for each problem of ``value``."""

    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class _Str(_Node):
    name_like: bool = False
    """The value names an object: a DNS-1123 subdomain."""

    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        if not isinstance(value, str):
            out.append((path, f"expected a string, got {_type_name(value)}"))
        elif self.name_like and (problem := _dns_subdomain_problem(value)):
            out.append((path, problem))


@dataclass(frozen=True)
class _Int32(_Node):
    minimum: int | None = None

    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            out.append((path, f"expected an integer (int32), got {_type_name(value)}"))
        elif not -(2**31) <= value <= INT32_MAX:
            out.append((path, f"{value} is outside int32"))
        elif self.minimum is not None and value < self.minimum:
            out.append((path, f"must be at least {self.minimum}, got {value}"))


@dataclass(frozen=True)
class _Bool(_Node):
    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        if not isinstance(value, bool):
            out.append((path, f"expected a boolean, got {_type_name(value)}"))


@dataclass(frozen=True)
class _Enum(_Node):
    values: tuple[str, ...]

    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        if not isinstance(value, str):
            out.append((path, f"expected a string, got {_type_name(value)}"))
        elif value not in self.values:
            out.append((path, f"{clean(value, 80)} is not one of {', '.join(self.values)}"))


@dataclass(frozen=True)
class _DateTime(_Node):
    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        if not isinstance(value, str):
            out.append((path, f"expected an RFC 3339 date-time string, got {_type_name(value)}"))
            return
        try:
            if not _RFC3339.fullmatch(value):
                raise ValueError
            datetime.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
        except ValueError:
            out.append((path, f"{clean(value, 80)} is not an RFC 3339 date-time (like 2030-01-31T12:00:00Z)"))


@dataclass(frozen=True)
class _StrMap(_Node):
    labels: bool = False
    """Keys and values must be valid label keys and values."""

    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        if not isinstance(value, dict):
            out.append((path, f"expected an object of strings, got {_type_name(value)}"))
            return
        for key, item in value.items():
            if not isinstance(item, str):
                out.append((f"{path}.{clean(key, 80)}", f"expected a string, got {_type_name(item)}"))
            elif self.labels:
                problem = _label_key_problem(str(key)) or _label_value_problem(item)
                if problem:
                    out.append((path, problem))


@dataclass(frozen=True)
class _List(_Node):
    item: _Node

    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        if not isinstance(value, list):
            out.append((path, f"expected a list, got {_type_name(value)}"))
            return
        for index, item in enumerate(value):
            self.item.check(item, f"{path}[{index}]", out)


@dataclass(frozen=True)
class _Obj(_Node):
    fields: Mapping[str, _Node]
    required: frozenset[str] = frozenset()
    opaque: bool = False
    """Only its type is checked (an object): the content is another party's (a ``status``)."""

    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        if not isinstance(value, dict):
            out.append((path, f"expected an object, got {_type_name(value)}"))
            return
        if self.opaque:
            return
        prefix = f"{path}." if path else ""
        for name in sorted(self.required - value.keys()):
            out.append((f"{prefix}{name}", "required field missing"))
        for name, item in value.items():
            node = self.fields.get(name)
            if node is None:
                known = ", ".join(sorted(self.fields))
                out.append((f"{prefix}{clean(name, 80)}", f"unknown field (known here: {known})"))
            else:
                node.check(item, f"{prefix}{name}", out)


@dataclass(frozen=True)
class _K8s(_Node):
    """A Kubernetes API type (``model``: the official client's model name, like ``V1PodSpec``)."""

    model: str

    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        if not isinstance(value, dict):
            out.append((path, f"expected an object ({self.model[2:]}), got {_type_name(value)}"))
            return
        for sub, message in _EMBEDDED.check(self.model, value):
            out.append((f"{path}.{sub}" if sub else path, message))
        if self.model == "V1PodSpec" and isinstance(value.get("containers"), list) and not value["containers"]:
            out.append((f"{path}.containers", "a pod needs at least one container"))


@dataclass(frozen=True)
class _Meta(_Node):
    """``metadata`` of a top-level object: ObjectMeta, a name (or ``generateName``), valid labels."""

    def check(self, value: Any, path: str, out: list[tuple[str, str]]) -> None:
        _K8s("V1ObjectMeta").check(value, path, out)
        if not isinstance(value, dict):
            return
        name, generate = value.get("name"), value.get("generateName")
        if not name and not generate:
            out.append((f"{path}.name", "required field missing (or generateName)"))
        if isinstance(name, str) and name and (problem := _dns_subdomain_problem(name)):
            out.append((f"{path}.name", problem))
        if isinstance(value.get("namespace"), str) and value["namespace"]:
            if len(value["namespace"]) > 63 or "." in value["namespace"] or _dns_subdomain_problem(value["namespace"]):
                out.append((f"{path}.namespace", f"{clean(value['namespace'], 80)} is not a DNS-1123 label"))
        if isinstance(value.get("labels"), dict):
            _StrMap(labels=True).check(value["labels"], f"{path}.labels", out)


# -- embedded Kubernetes types ----------------------------------------------------------------------------

_WRAPPERS: dict[str, Callable[[dict], dict]] = {
    # how kubernetes-validate sees one embedded type: inside the smallest object of a kind it knows
    "V1PodSpec": lambda v: {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": v},
    "V1NetworkPolicyIngressRule": lambda v: {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                                             "metadata": {"name": "x"}, "spec": {"podSelector": {}, "ingress": [v]}},
    "V1NetworkPolicyEgressRule": lambda v: {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                                            "metadata": {"name": "x"}, "spec": {"podSelector": {}, "egress": [v]}},
    "V1PersistentVolumeClaimSpec": lambda v: {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                              "metadata": {"name": "x"}, "spec": v},
    "V1ObjectMeta": lambda v: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": v},
}
_WRAPPED_AT: dict[str, tuple[Any, ...]] = {
    "V1PodSpec": ("spec",), "V1PersistentVolumeClaimSpec": ("spec",), "V1ObjectMeta": ("metadata",),
    "V1NetworkPolicyIngressRule": ("spec", "ingress", 0), "V1NetworkPolicyEgressRule": ("spec", "egress", 0)}


def _first_difference(want: Any, got: Any, path: str = "") -> str | None:
    """Where ``got`` (the object as the client's model writes it back) differs from ``want``."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in want:  # a field as given that the model writes back otherwise (a snake_case spelling)
            if key not in got:
                return f"{path}.{key}".lstrip(".")
        for key in got:
            if key not in want:
                return f"{path}.{key}".lstrip(".")
            found = _first_difference(want[key], got[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for index, (a, b) in enumerate(zip(want, got)):
            found = _first_difference(a, b, f"{path}[{index}]")
            if found:
                return found
        return None
    return None if want == got and type(want) is type(got) else (path.lstrip(".") or "(the object)")


def _loc(loc: Sequence[Any]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text.lstrip(".")


@dataclass
class _Embedded:
    """Checks an embedded Kubernetes type with the best checker at hand (module docstring)."""

    _kind: str | None = None
    _kv_version: str = ""
    _cache: dict[str, Any] = field(default_factory=dict)

    def kind(self) -> str:
        if self._kind is None:
            self._kind = "shape only"
            try:
                from kubernetes.client import models

                if hasattr(models.V1PodSpec, "model_validate"):
                    self._kind = "kubernetes client models"
            except ImportError:
                pass
            if self._kind == "shape only":
                try:
                    import kubernetes_validate

                    self._kv_version = kubernetes_validate.latest_version()
                    self._kind = f"kubernetes-validate {self._kv_version}"
                except ImportError:
                    pass
        return self._kind

    def check(self, model: str, value: dict) -> list[tuple[str, str]]:
        kind = self.kind()
        if kind == "kubernetes client models":
            return self._with_models(model, value)
        if kind.startswith("kubernetes-validate"):
            return self._with_kubernetes_validate(model, value)
        return self._shape(model, value)

    @staticmethod
    def _with_models(model: str, value: dict) -> list[tuple[str, str]]:
        from kubernetes.client import models
        from pydantic import ValidationError

        cls = getattr(models, model)
        try:
            parsed = cls.model_validate(value)
        except ValidationError as exc:
            return [(clean(_loc(e["loc"]), 200), clean(e["msg"], 200)) for e in exc.errors()]
        back = parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
        where = _first_difference(value, back)
        if where is not None:
            return [(clean(where, 200), f"not in the API's form: {model[2:]} reads it back otherwise "
                                        "(a snake_case field name, or a value of another type)")]
        return []

    def _with_kubernetes_validate(self, model: str, value: dict) -> list[tuple[str, str]]:
        import kubernetes_validate

        try:
            kubernetes_validate.validate(_WRAPPERS[model](value), self._kv_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            at = tuple(getattr(exc, "path", ()) or ())
            inner = _WRAPPED_AT[model]
            return [(clean(_loc(at[len(inner):] if at[:len(inner)] == inner else at), 200),
                     clean(getattr(exc, "message", exc), 200))]
        return []

    @staticmethod
    def _shape(model: str, value: dict) -> list[tuple[str, str]]:
        if model != "V1PodSpec":
            return []
        containers = value.get("containers")
        if not isinstance(containers, list):
            return [("containers", "required field missing" if containers is None else "expected a list")]
        return [(f"containers[{i}].name", "required field missing") for i, c in enumerate(containers)
                if not isinstance(c, dict) or not isinstance(c.get("name"), str)]


_EMBEDDED = _Embedded()


def embedded_checker() -> str:
    """Which checker the embedded Kubernetes types get: ``"kubernetes client models"``,
    ``"kubernetes-validate <version>"`` or ``"shape only"`` (module docstring)."""
    return _EMBEDDED.kind()


# -- the kinds ----------------------------------------------------------------------------------------------

_POD_METADATA = _Obj({"labels": _StrMap(labels=True), "annotations": _StrMap()})
_POD_TEMPLATE = _Obj({"metadata": _POD_METADATA, "spec": _K8s("V1PodSpec")}, frozenset({"spec"}))
_PVC_TEMPLATE = _Obj({"metadata": _Obj({"name": _Str(name_like=True), "labels": _StrMap(labels=True),
                                        "annotations": _StrMap()}),
                      "spec": _K8s("V1PersistentVolumeClaimSpec")}, frozenset({"spec"}))
_BLUEPRINT = {"podTemplate": _POD_TEMPLATE, "volumeClaimTemplates": _List(_PVC_TEMPLATE), "service": _Bool()}
"""The workload fields a Sandbox and a SandboxTemplate share (upstream's SandboxBlueprint)."""
_REF = _Obj({"name": _Str(name_like=True)}, frozenset({"name"}))

SPECS: dict[str, tuple[str, _Obj]] = {
    "Sandbox": (SANDBOX_API_VERSION, _Obj({
        **_BLUEPRINT,
        "shutdownTime": _DateTime(),
        "shutdownPolicy": _Enum(("Delete", "Retain")),
        "operatingMode": _Enum(("Running", "Suspended")),
    }, frozenset({"podTemplate"}))),
    "SandboxTemplate": (EXTENSIONS_API_VERSION, _Obj({
        **_BLUEPRINT,
        "networkPolicy": _Obj({"ingress": _List(_K8s("V1NetworkPolicyIngressRule")),
                               "egress": _List(_K8s("V1NetworkPolicyEgressRule"))}),
        "networkPolicyManagement": _Enum(("Managed", "Unmanaged")),
        "envVarsInjectionPolicy": _Enum(("Allowed", "Overrides", "Disallowed")),
        "volumeClaimTemplatesPolicy": _Enum(("Disallowed", "Allowed", "Overrides")),
    }, frozenset({"podTemplate"}))),
    "SandboxWarmPool": (EXTENSIONS_API_VERSION, _Obj({
        "replicas": _Int32(minimum=0),
        "sandboxTemplateRef": _REF,
        "updateStrategy": _Obj({"type": _Enum(("Recreate", "OnReplenish"))}),
    }, frozenset({"sandboxTemplateRef"}))),
    "SandboxClaim": (EXTENSIONS_API_VERSION, _Obj({
        "warmPoolRef": _REF,
        "lifecycle": _Obj({"shutdownTime": _DateTime(), "ttlSecondsAfterFinished": _Int32(minimum=0),
                           "shutdownPolicy": _Enum(("Delete", "DeleteForeground", "Retain"))}),
        "additionalPodMetadata": _POD_METADATA,
        "env": _List(_Obj({"name": _Str(), "value": _Str(), "containerName": _Str()},
                          frozenset({"name", "value"}))),
        "volumeClaimTemplates": _List(_PVC_TEMPLATE),
    }, frozenset({"warmPoolRef"}))),
}
"""Per kind: its apiVersion and the schema of its ``spec``."""

_STATUS = _Obj({}, opaque=True)


def check(obj: Any) -> list[str]:
    """Every problem of ``obj`` (a manifest as a JSON-ready dict) as an agent-sandbox object of one of
    :data:`SPECS`' kinds, each ``"<Kind> <field path>: <message>"`` (escaped); ``[]`` when valid. Top
    level: ``apiVersion`` (exactly the kind's), ``kind``, ``metadata`` and ``spec`` required, ``status``
    allowed (its content is the controller's and not checked), nothing else."""
    if not isinstance(obj, dict):
        return [f"(object): expected an object, got {_type_name(obj)}"]
    kind = obj.get("kind")
    if kind not in SPECS:
        return [f"{clean(kind, 80) if isinstance(kind, str) else '(no kind)'} kind: not an agent-sandbox kind "
                f"({', '.join(SPECS)})"]
    api_version, spec = SPECS[kind]
    out: list[tuple[str, str]] = []
    if obj.get("apiVersion") != api_version:
        got = obj.get("apiVersion")
        out.append(("apiVersion", f"expected {api_version}, got "
                                  f"{clean(got, 80) if isinstance(got, str) else _type_name(got)}"))
    top = _Obj({"apiVersion": _Str(), "kind": _Str(), "metadata": _Meta(), "spec": spec, "status": _STATUS},
               frozenset({"apiVersion", "kind", "metadata", "spec"}))
    top.check(obj, "", out)
    return [f"{kind} {path}: {message}" for path, message in out]


def validate(obj: Any) -> None:
    """Raise :class:`AgentSandboxSchemaError` (every problem :func:`check` finds) unless ``obj`` is a
    valid agent-sandbox object."""
    problems = check(obj)
    if problems:
        raise AgentSandboxSchemaError(problems)
