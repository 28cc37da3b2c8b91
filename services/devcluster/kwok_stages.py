"""How kwok plays the kubelet for pods on the local control plane.

kwok's built-in pod lifecycle completes every pod a batch/v1 Job owns at once, so a training
Job would finish the moment it started. Real trainers run until they are done or deleted, so
the local control plane replaces kwok's pod stages with two of its own: a pod bound to a kwok
node becomes Running and Ready, and a deleted pod goes away. Nothing completes by itself:
pods of batch Jobs, Volcano Jobs and PyTorchJobs stay Running until deleted. Node stages are
kwok's own (they are kept whenever no node stage is configured).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

STAGE_API = "kwok.x-k8s.io/v1alpha1"

# Status of a pod that kwok has "started" on its node: every container running and ready.
_RUNNING_STATUS = """\
{{ $now := Now }}
phase: Running
startTime: {{ $now | Quote }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) \
( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
conditions:
- type: Initialized
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: PodScheduled
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
"""


def pod_stages() -> list[dict[str, Any]]:
    """The pod lifecycle: bound -> Running and Ready; deleted -> gone. No completion."""
    pod = {"apiGroup": "v1", "kind": "Pod"}
    return [
        {
            "apiVersion": STAGE_API,
            "kind": "Stage",
            "metadata": {"name": "tideshift-pod-running"},
            "spec": {
                "resourceRef": pod,
                "selector": {
                    "matchExpressions": [
                        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                        {"key": ".spec.nodeName", "operator": "Exists"},
                        {"key": ".status.podIP", "operator": "DoesNotExist"},
                    ]
                },
                "next": {"statusTemplate": _RUNNING_STATUS},
            },
        },
        {
            "apiVersion": STAGE_API,
            "kind": "Stage",
            "metadata": {"name": "tideshift-pod-deleted"},
            "spec": {
                "resourceRef": pod,
                "selector": {
                    "matchExpressions": [
                        {"key": ".metadata.deletionTimestamp", "operator": "Exists"}
                    ]
                },
                "next": {"finalizers": {"empty": True}, "delete": True},
            },
        },
    ]


def write_kwok_config(path: Path) -> Path:
    """kwok's `--config` file holding the pod stages; returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(pod_stages(), sort_keys=False))
    return path
