"""``desktop-sandbox audit``: the network audit (:mod:`controller.audit`) of a policy file or a task's
``[network]`` table, run on a backend that has one."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Optional

import typer

from controller.commands.common import backend_class, console, error, refuse, say, with_arch
from controller.run.progress import make_console


def audit(policy: Optional[Path], task: Optional[Path], *, json_out: Optional[Path], image_tag: Optional[str],
          backend: str, arch: str) -> None:
    """Probe ``policy`` (a TOML file), or ``task``'s network table, or deny-all, from inside a guest of
    ``backend``; print the table, write the JSON report to ``json_out`` when given. Exit 0 only if every
    probe passed, 1 if one failed, 2 when the input is refused or the audit could not run."""
    import docker.errors
    from pydantic import ValidationError

    from controller.audit import AuditError, render_table
    from controller.audit.backends import audit_function
    from controller.gateway.policy import NetworkPolicy
    from controller.run.tasks import TaskError, load_task
    from controller.sandbox import SandboxError
    from controller.validation import describe_validation_error

    backend_cls = backend_class(backend)
    try:
        audit_backend = audit_function(backend)
    except KeyError:
        refuse(f"the {backend} backend has no network audit (audit runs on the docker and vm backends)")
    if policy is not None and task is not None:
        refuse("give --policy or --task, not both")
    if task is not None:
        try:
            network = load_task(task).network
        except TaskError as exc:  # one line naming the file and the field
            refuse(f"cannot load task: {exc}")
    else:
        try:
            network = NetworkPolicy.from_toml(policy) if policy else NetworkPolicy()
        except ValidationError as exc:
            refuse(f"bad policy {policy}: {describe_validation_error(exc, known_keys=NetworkPolicy.model_fields)}")
        except OSError as exc:
            refuse(f"bad policy {policy}: cannot read: {exc.strerror or exc}")
        except tomllib.TOMLDecodeError as exc:
            refuse(f"bad policy {policy}: TOML syntax error: {exc}")
        except UnicodeDecodeError as exc:
            refuse(f"bad policy {policy}: not UTF-8 text (byte {exc.start})")
    try:
        options = backend_cls.ensure_image(with_arch(backend_cls.make_options(image=image_tag), arch), say)
        with console.status(f"auditing ({backend} sandbox, probes)"):
            result = audit_backend(network, image=options.image)
    except (AuditError, SandboxError, docker.errors.DockerException) as exc:
        error("audit could not run:", exc)
        raise typer.Exit(2) from None
    render_table(result, make_console())
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(result.to_json() + "\n", encoding="utf-8")
        console.print(f"report written to {json_out}")
    raise typer.Exit(0 if result.passed else 1)
