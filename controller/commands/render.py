"""``desktop-sandbox render``: the Kubernetes manifests of one sandbox for a task, printed as YAML
(:func:`controller.sandbox.kubernetes.render_for_task`), or with ``--pool N`` that sandbox as a warm pool
of agent-sandbox objects (:func:`controller.sandbox.kubernetes_manifests.render_pool_for_task`);
nothing is contacted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from controller.commands.common import refuse
from controller.text import clean


def render(task_file: Path, *, backend: str, namespace: Optional[str], image_tag: Optional[str],
           pool: Optional[int] = None) -> None:
    """Print the manifests ``--backend kubernetes`` creates for ``task_file`` in ``namespace`` (default
    ``$DESKTOP_SANDBOX_K8S_NAMESPACE``, else desktop-sandbox) pulling ``image_tag``; with ``pool`` (a
    number of sandboxes, ``>= 0``) the task's warm pool instead: SandboxTemplate, SandboxWarmPool
    (``replicas: pool``), SandboxClaim and the objects they use. Refuses (exit 2) a bad task, another
    backend, a policy the render cannot keep (mode ``ask``; with ``pool`` anything but ``deny-all``), a
    negative ``pool``, or a missing PyYAML."""
    from controller.run.tasks import TaskError, load_task
    from controller.sandbox import SandboxSpec

    if backend != "kubernetes":
        refuse(f"render: only --backend kubernetes has manifests (not {clean(backend, 40)})")
    if pool is not None and pool < 0:
        refuse(f"render: --pool must be 0 or more (not {pool})")
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
        if pool is None:
            text = k8s.render_for_task(spec, options)
        else:
            from controller.sandbox import kubernetes_manifests as manifests

            text = manifests.render_pool_for_task(spec, options, manifests.pool_name(task_file.stem), pool)
    except ValueError as exc:
        refuse(f"cannot render {clean(task_file, 200)}: {clean(exc, 400)}")
    except ImportError:
        refuse("render needs PyYAML: pip install 'desktop-sandbox[kubernetes]'")
    typer.echo(text, nl=False)
