"""``desktop-sandbox render``: the Kubernetes manifests of one sandbox for a task, printed as YAML
(:func:`controller.sandbox.kubernetes.render_for_task`); nothing is contacted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from controller.commands.common import refuse
from controller.text import clean


def render(task_file: Path, *, backend: str, namespace: Optional[str], image_tag: Optional[str]) -> None:
    """Print the manifests ``--backend kubernetes`` creates for ``task_file`` in ``namespace`` (default
    ``$DESKTOP_SANDBOX_K8S_NAMESPACE``, else desktop-sandbox) pulling ``image_tag``; refuses (exit 2) a
    bad task, another backend, or a missing PyYAML."""
    from controller.run.tasks import TaskError, load_task
    from controller.sandbox import SandboxSpec

    if backend != "kubernetes":
        refuse(f"render: only --backend kubernetes has manifests (not {clean(backend, 40)})")
    try:
        task = load_task(task_file)
    except TaskError as exc:
        refuse(f"cannot load task: {exc}")
    from controller.sandbox import kubernetes as k8s

    options = k8s.KubernetesSandbox.make_options(image=image_tag)
    options.namespace = namespace or os.environ.get(k8s.NAMESPACE_ENV) or "desktop-sandbox"
    spec = SandboxSpec(screen_width=task.screen.width, screen_height=task.screen.height,
                       policy=task.network.model_dump(mode="json"))
    try:
        typer.echo(k8s.render_for_task(spec, options), nl=False)
    except ValueError as exc:
        refuse(f"cannot render {clean(task_file, 200)}: {clean(exc, 400)}")
    except ImportError:
        refuse("render needs PyYAML: pip install 'desktop-sandbox[kubernetes]'")
