"""``desktop-sandbox audit``: the network audit (:mod:`controller.audit`) of a policy file or a task's
``[network]`` table, run on a backend that has one."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from controller.commands.common import backend_class, console, error, refuse, say, with_arch
from controller.run.progress import make_console

if TYPE_CHECKING:  # pragma: no cover
    from controller.gateway.policy import NetworkPolicy


def audit(policy: Optional[Path], task: Optional[Path], *, json_out: Optional[Path], image_tag: Optional[str],
          backend: str, arch: str, swap_from: Optional[Path] = None, via_pool: bool = False) -> None:
    """Probe ``policy`` (a TOML file), or ``task``'s network table, or deny-all, from inside a guest of
    ``backend``; print the table, write the JSON report to ``json_out`` when given. ``swap_from`` (a
    policy file): start the sandbox with that policy and swap the audited one in at runtime first;
    ``via_pool``: audit a sandbox claimed from a warm pool (both docker only). Exit 0 only if every
    probe passed, 1 if one failed, 2 when the input is refused or the audit could not run."""
    import docker.errors

    from controller.audit import AuditError, render_table
    from controller.audit.backends import SWAPPED_AUDITS, audit_function
    from controller.run.tasks import TaskError, load_task
    from controller.sandbox import SandboxError

    backend_cls = backend_class(backend)
    try:
        audit_backend = audit_function(backend)
    except KeyError:
        refuse(f"the {backend} backend has no network audit (audit runs on the docker and vm backends)")
    if policy is not None and task is not None:
        refuse("give --policy or --task, not both")
    if (swap_from is not None or via_pool) and backend not in SWAPPED_AUDITS:
        refuse(f"--swap-from and --via-pool run on the {' and '.join(sorted(SWAPPED_AUDITS))} backend only, "
               f"not {backend}")
    if task is not None:
        try:
            network = load_task(task).network
        except TaskError as exc:  # one line naming the file and the field
            refuse(f"cannot load task: {exc}")
    else:
        network = _policy_file(policy, "policy")
    extra = {}
    if swap_from is not None:
        extra["swap_from"] = _policy_file(swap_from, "--swap-from policy")
    if via_pool:
        extra["via_pool"] = True
    try:
        options = backend_cls.ensure_image(with_arch(backend_cls.make_options(image=image_tag), arch), say)
        with console.status(f"auditing ({backend} sandbox, probes)"):
            result = audit_backend(network, image=options.image, **extra)
    except (AuditError, SandboxError, docker.errors.DockerException) as exc:
        error("audit could not run:", exc)
        raise typer.Exit(2) from None
    render_table(result, make_console())
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(result.to_json() + "\n", encoding="utf-8")
        console.print(f"report written to {json_out}")
    raise typer.Exit(0 if result.passed else 1)


def _policy_file(path: Optional[Path], what: str) -> "NetworkPolicy":
    """The policy in the TOML file ``path`` (deny-all when None); refuses (exit 2) with one line naming
    ``what``, the file and the reason when it cannot be read or is not a policy."""
    from pydantic import ValidationError

    from controller.gateway.policy import NetworkPolicy
    from controller.validation import describe_validation_error

    try:
        return NetworkPolicy.from_toml(path) if path else NetworkPolicy()
    except ValidationError as exc:
        refuse(f"bad {what} {path}: {describe_validation_error(exc, known_keys=NetworkPolicy.model_fields)}")
    except OSError as exc:
        refuse(f"bad {what} {path}: cannot read: {exc.strerror or exc}")
    except tomllib.TOMLDecodeError as exc:
        refuse(f"bad {what} {path}: TOML syntax error: {exc}")
    except UnicodeDecodeError as exc:
        refuse(f"bad {what} {path}: not UTF-8 text (byte {exc.start})")
