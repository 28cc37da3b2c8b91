"""The one Deployment the chaos and fuzz scenarios scale: unlabelled, so no planner plans it,
and only commands under test move its replicas."""

from __future__ import annotations

from tideshift.services.cluster.adapters.http import KubeHttp


def create_web_deployment(
    admin: KubeHttp, namespace: str, *, replicas: int, schedulable: bool = True
) -> str:
    """Create Deployment `web` in `namespace`; return its API path. Unschedulable pods stay
    Pending (no node carries the selector's label), for scenarios where only the spec matters."""
    pod_spec: dict[str, object] = {"containers": [{"name": "web", "image": "nginx"}]}
    if not schedulable:
        pod_spec["nodeSelector"] = {"tideshift.io/chaos": "nowhere"}
    admin.json(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        body={
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod_spec},
            },
        },
    )
    return f"/apis/apps/v1/namespaces/{namespace}/deployments/web"
