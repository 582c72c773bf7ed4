"""A recorded-API test double of a Kubernetes API server, under the official client.

No cluster can run on the development machine (nor in CI), so the Kubernetes backend's start and
teardown are tested against this instead: the real ``kubernetes.client`` (``ApiClient``, ``CoreV1Api``,
``NetworkingV1Api``) serialises every request and parses every answer, and only its HTTP transport (the
urllib3 pool manager) is replaced by :class:`FakeCluster`, which keeps the objects created in memory,
answers create / read / list (label selectors) / delete / log as the API server does for the few
resources the backend uses, and records every request (method, path, query, body). Pods start
``Pending`` and are ``Running`` from their second read (``pod_phases`` changes that), Services get a
cluster IP. The exec and port-forward streams (websockets) are not part of the double: tests give the
backend stand-ins for them (``Apis.exec``, ``Apis.forward``).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from urllib3 import HTTPHeaderDict

PLURALS = {"pods": "Pod", "services": "Service", "secrets": "Secret", "configmaps": "ConfigMap",
           "networkpolicies": "NetworkPolicy"}


@dataclass
class Call:
    """One request: ``method``, ``path`` (no query), ``query`` (dict of lists), ``body`` (parsed JSON)."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any = None


class _Response:
    def __init__(self, status: int, body: Any, content_type: str = "application/json") -> None:
        self.status = status
        self.reason = {200: "OK", 201: "Created", 404: "Not Found", 409: "Conflict", 403: "Forbidden"}.get(status, "")
        self.data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.headers = HTTPHeaderDict({"Content-Type": content_type})

    def getheaders(self) -> HTTPHeaderDict:
        return self.headers

    def getheader(self, name: str, default: Any = None) -> Any:
        return self.headers.get(name, default)


def _status(code: int, message: str) -> _Response:
    return _Response(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                            "code": code, "reason": {404: "NotFound", 409: "AlreadyExists", 403: "Forbidden"}.get(code)})


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, sep, value = term.partition("=")
        if not sep:
            if key not in labels:
                return False
        elif labels.get(key) != value:
            return False
    return True


@dataclass
class FakeCluster:
    """The API server double (module docstring). ``objects``: ``(kind, namespace, name) -> object``;
    ``calls``: every request in order; ``fail_create``: kind -> HTTP status to answer its creation with;
    ``pod_phases``: the phases a Pod's successive reads report (the last one repeats);
    ``waiting_reason``: why a container of a Pod not yet running waits (``ErrImagePull``, ...)."""

    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    fail_create: dict[str, int] = field(default_factory=dict)
    pod_phases: tuple[str, ...] = ("Pending", "Running")
    waiting_reason: str = "ContainerCreating"
    _reads: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _uid: int = 0

    # urllib3.PoolManager's interface, as kubernetes.client.rest uses it
    def request(self, method: str, url: str, body: Any = None, fields: Any = None, headers: Any = None,
                **_: Any) -> _Response:
        parsed = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qs(parsed.query)
        data = json.loads(body) if isinstance(body, (str, bytes)) and body else None
        with self._lock:
            self.calls.append(Call(method, parsed.path, query, data))
            return self._answer(method, parsed.path, query, data)

    def clear(self) -> None:
        pass

    # -- the API ---------------------------------------------------------------------------------------------

    def _answer(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> _Response:
        parts = path.strip("/").split("/")
        # /api/v1/namespaces/NS/PLURAL[/NAME[/log]] or /apis/networking.k8s.io/v1/namespaces/NS/PLURAL[/NAME]
        i = parts.index("namespaces")
        namespace, plural = parts[i + 1], parts[i + 2]
        name = parts[i + 3] if len(parts) > i + 3 else None
        sub = parts[i + 4] if len(parts) > i + 4 else None
        kind = PLURALS[plural]
        if method == "POST" and name is None:
            return self._create(kind, namespace, body)
        if method == "GET" and name is None:
            selector = (query.get("labelSelector") or [""])[0]
            items = [o for (k, ns, _), o in self.objects.items()
                     if k == kind and ns == namespace and _matches(o["metadata"].get("labels") or {}, selector)]
            api_version = "networking.k8s.io/v1" if kind == "NetworkPolicy" else "v1"
            return _Response(200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": {}, "items": items})
        key = (kind, namespace, name)
        if key not in self.objects:
            return _status(404, f'{plural} "{name}" not found')
        if method == "GET" and sub == "log":
            return _Response(200, f"log of {name}\n".encode(), "text/plain")
        if method == "GET":
            return _Response(200, self._read(kind, key))
        if method == "DELETE":
            gone = self.objects.pop(key)
            # the API server answers with the object for Pods and Services, with a Status for the rest
            return _Response(200, gone if kind in ("Pod", "Service") else {"kind": "Status", "apiVersion": "v1",
                                                                          "status": "Success"})
        return _status(405, f"{method} not supported by the double")

    def _create(self, kind: str, namespace: str, body: dict[str, Any]) -> _Response:
        if kind in self.fail_create:
            return _status(self.fail_create[kind], f"{kind} creation refused by the double")
        name = body["metadata"]["name"]
        key = (kind, namespace, name)
        if key in self.objects:
            return _status(409, f'{kind} "{name}" already exists')
        self._uid += 1
        obj = json.loads(json.dumps(body))
        obj["metadata"].update(uid=f"uid-{self._uid}", resourceVersion=str(self._uid),
                               creationTimestamp="2030-05-17T12:00:00Z")
        if kind == "Service":
            obj["spec"]["clusterIP"] = f"10.96.0.{self._uid}"
        if kind == "Pod":
            obj["status"] = {"phase": "Pending"}
        self.objects[key] = obj
        return _Response(201, obj)

    def _read(self, kind: str, key: tuple[str, str, str]) -> dict[str, Any]:
        obj = self.objects[key]
        if kind == "Pod":
            n = self._reads.get(key[2], 0)
            self._reads[key[2]] = n + 1
            phase = self.pod_phases[min(n, len(self.pod_phases) - 1)]
            running = phase == "Running"
            obj["status"] = {"phase": phase, "podIP": "10.244.0.9", "containerStatuses": [
                {"name": c["name"], "ready": running, "restartCount": 0, "image": c["image"],
                 "imageID": f"{c['image']}@sha256:{'ab' * 32}",
                 "state": {"running": {"startedAt": "2030-05-17T12:00:01Z"}} if running else
                 {"waiting": {"reason": self.waiting_reason, "message": "as the double says"}}} for c in obj["spec"]["containers"]]}
        return obj

    # -- what tests look at ------------------------------------------------------------------------------------

    def kinds_created(self) -> list[str]:
        """``Kind/name`` of each object created, in order."""
        return [f"{PLURALS[c.path.rstrip('/').split('/')[-1]]}/{c.body['metadata']['name']}"
                for c in self.calls if c.method == "POST"]

    def deleted(self) -> list[str]:
        """``plural/name`` of each DELETE, in order."""
        return ["/".join(c.path.split("/")[-2:]) for c in self.calls if c.method == "DELETE"]


def official_apis(cluster: FakeCluster) -> tuple[Any, Any]:
    """``(CoreV1Api, NetworkingV1Api)`` of the official client, talking to ``cluster``."""
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = "https://cluster.invalid"
    api_client = client.ApiClient(configuration)
    api_client.rest_client.pool_manager = cluster
    return client.CoreV1Api(api_client), client.NetworkingV1Api(api_client)
