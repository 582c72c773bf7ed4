"""The proxy routes of the agent's chromium: which guest-local services it reaches without the gateway.

Chromium takes its proxy from the managed policy (``images/chromium/policies.json``, installed as
:data:`MANAGED_POLICY`): every connection to the gateway's proxy, loopback and link-local included
(``<-loopback>`` in ``ProxyBypassList`` removes chromium's implicit direct rule for them; the gateway
refuses those addresses), WebRTC without a UDP or TCP path that skips the proxy (``WebRtcIPHandling``).
That file alone is safe: nothing is direct. The guest-local origins the URL rule lets chromium load
(:class:`wire.browser_tools.GuestUrlRule`, with the origins chromium is launched with) must be direct, as
the gateway cannot reach the guest's loopback: as chromium is launched the agent writes their
``host:port`` (:meth:`wire.browser_tools.GuestUrlRule.direct_hosts`) into a second policy file,
:meth:`ProxyRoutes.write`, the static file's ``ProxySettings`` with those hosts added to its bypass list.
The image's managed policy directory holds a link to that file under a name that sorts after the
static one (``desktop-sandbox.proxy.json``: of two managed files setting one policy, chromium takes the
one last in name order); a missing or unreadable file leaves the static policy in force.

The file lives in a directory only the agent writes (``/run/desktop-sandbox-browser``: agent, 0755; the
desktop user can neither write, replace nor rename it) and is replaced atomically (written aside, then
renamed). Chromium reads it as it starts: a rule set while it runs changes what the agent lets through
(its request guard), not chromium's direct routes, until chromium is launched again.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any, Iterable

ROUTES_ENV = "AGENT_BROWSER_POLICY"
"""Environment variable naming the policy file the agent writes (images/supervisor/desktop.conf); unset
or empty: no file is written (a local agent whose chromium has no managed policy)."""
MANAGED_POLICY = "/etc/chromium/policies/managed/desktop-sandbox.json"
"""The static managed policy (images/provision.sh installs images/chromium/policies.json here)."""
MAX_POLICY_BYTES = 256 * 1024
"""Largest static policy file the agent reads."""


class ProxyRoutes:
    """Writes the proxy part of chromium's managed policy (module docstring): ``path`` the file written,
    ``static`` the static policy whose ``ProxySettings`` it extends."""

    def __init__(self, path: str, static: str = MANAGED_POLICY) -> None:
        self.path, self.static = Path(path), Path(static)

    @classmethod
    def from_env(cls) -> "ProxyRoutes | None":
        """The routes file ``$AGENT_BROWSER_POLICY`` names (an absolute path), or None when it is unset."""
        path = os.environ.get(ROUTES_ENV) or ""
        return cls(path) if path.startswith("/") else None

    def settings(self, direct: Iterable[str]) -> dict[str, Any]:
        """The policy to write: ``{"ProxySettings": ...}``, the static file's with each ``host:port`` of
        ``direct`` appended to its ``ProxyBypassList`` (comma-separated). Raises OSError when the static
        file cannot be read or sets no fixed proxy (``ProxyMode`` ``fixed_servers`` and a ``ProxyServer``)."""
        try:
            with self.static.open("rb") as file:
                raw = file.read(MAX_POLICY_BYTES + 1)
            if len(raw) > MAX_POLICY_BYTES:
                raise ValueError(f"larger than {MAX_POLICY_BYTES} bytes")
            proxy = json.loads(raw).get("ProxySettings")
        except (ValueError, AttributeError) as exc:
            raise OSError(errno.EINVAL, f"the managed policy {self.static} cannot be read: {exc}"[:300]) from None
        if not (isinstance(proxy, dict) and proxy.get("ProxyMode") == "fixed_servers"
                and isinstance(proxy.get("ProxyServer"), str) and isinstance(proxy.get("ProxyBypassList", ""), str)):
            raise OSError(errno.EINVAL, f"the managed policy {self.static} sets no fixed proxy")
        rules = [r.strip() for r in str(proxy.get("ProxyBypassList", "")).replace(";", ",").split(",") if r.strip()]
        return {"ProxySettings": {**proxy, "ProxyBypassList": ",".join(dict.fromkeys([*rules, *direct]))}}

    def write(self, direct: Iterable[str]) -> None:
        """Replace the file with :meth:`settings` of ``direct`` (``host:port`` strings, already checked:
        :meth:`wire.browser_tools.GuestUrlRule.direct_hosts`), atomically, mode 0644. Its directory is
        made (0755) when missing and must be this process's own, a directory that no one else may write;
        raises OSError otherwise, or when the file cannot be written."""
        body = json.dumps(self.settings(direct), indent=1).encode() + b"\n"
        folder = self.path.parent
        try:
            os.mkdir(folder, 0o755)
        except FileExistsError:
            pass
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise OSError(errno.EPERM, f"{folder} is not a directory only the agent writes")
        aside = folder / f".{self.path.name}.{secrets.token_hex(6)}"
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:
            os.close(fd)
            os.unlink(aside)
            raise
        os.close(fd)
        try:
            os.replace(aside, self.path)
        except BaseException:
            os.unlink(aside)
            raise
