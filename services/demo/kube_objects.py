"""The Kubernetes objects of the real-cluster demo: its world sized for a small test control
plane, and the namespace, priority classes, serving Deployment and trainer StatefulSets that
carry it. Decides manifests only; talks to the API server through the client it is given."""

from __future__ import annotations

import contextlib
from typing import Any

from tideshift.events.models import ServingPolicy, TrainingPolicy, annotation_of
from tideshift.services.demo.world import JobShape, ServingShape, WorldShape

APP = "web"
# Sized for the test control plane (3 x 8-core kwok nodes and a GPU node) and for real HTTP on a
# small machine: a day between 40 and 200 req/s, 10 req/s per replica of one core, so serving
# takes ~5 cores at night and ~25 by day, and two jobs of up to 4 two-core trainers the rest.
KUBE_SERVING = ServingShape(
    name=APP,
    namespace="",  # filled with the run's namespace
    cpu=1.0,
    memory_gib=0.5,
    capacity_rps=10.0,
    min_replicas=2,
    max_replicas=30,
    startup_delay_s=0.0,
)
KUBE_JOBS = (
    JobShape(
        "ctr-a",
        trainer_cpu=2.0,
        trainer_memory_gib=2.0,
        max_trainers=4,
        pservers=0,
        kind="StatefulSet",
    ),
    JobShape(
        "ctr-b",
        trainer_cpu=2.0,
        trainer_memory_gib=2.0,
        max_trainers=4,
        pservers=0,
        kind="StatefulSet",
    ),
)


def create_objects(
    api_client: Any, namespace: str, shape: WorldShape, *, initial_demand_rps: float
) -> None:
    from kubernetes import client

    # Manifests as plain dicts (the client serialises them as they are): typed as Any.
    core: Any = client.CoreV1Api(api_client)
    apps: Any = client.AppsV1Api(api_client)
    scheduling: Any = client.SchedulingV1Api(api_client)
    core.create_namespace({"metadata": {"name": namespace}})
    for name, value in (("tideshift-demo-serving", 1000), ("tideshift-demo-training", 0)):
        # shared by every run: the first run creates them, the others find them there
        with contextlib.suppress(client.ApiException):
            scheduling.create_priority_class(
                {
                    "metadata": {"name": name},
                    "value": value,
                    "preemptionPolicy": "PreemptLowerPriority",
                }
            )
    apps.create_namespaced_deployment(
        namespace,
        serving_deployment(shape.serving, replicas=shape.serving.need(initial_demand_rps)),
    )
    for job in shape.jobs:
        apps.create_namespaced_stateful_set(namespace, trainer_stateful_set(job))


def serving_deployment(serving: ServingShape, *, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": serving.name,
            "annotations": {
                annotation_of(ServingPolicy, "min_replicas"): str(serving.min_replicas),
                annotation_of(ServingPolicy, "max_replicas"): str(serving.max_replicas),
            },
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": serving.name}},
            "template": {
                "metadata": {"labels": {"app": serving.name, "tideshift.io/role": "serving"}},
                "spec": _pod_spec(
                    "tideshift-demo-serving", serving.cpu, serving.memory_gib, "sample-app"
                ),
            },
        },
    }


def trainer_stateful_set(job: JobShape) -> dict[str, Any]:
    """A StatefulSet of trainers (stable names, parallel start): kwok completes Job pods at
    once, and elastic trainers are long-running members anyway."""
    return {
        "metadata": {
            "name": job.name,
            "annotations": {
                annotation_of(TrainingPolicy, "min_replicas"): str(job.min_trainers),
                annotation_of(TrainingPolicy, "max_replicas"): str(job.max_trainers),
            },
        },
        "spec": {
            "replicas": job.min_trainers,
            "serviceName": job.name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"job": job.name}},
            "template": {
                "metadata": {"labels": {"job": job.name, "tideshift.io/role": "training"}},
                "spec": _pod_spec(
                    "tideshift-demo-training", job.trainer_cpu, job.trainer_memory_gib, "trainer"
                ),
            },
        },
    }


def _pod_spec(priority_class: str, cpu: float, memory_gib: float, container: str) -> dict[str, Any]:
    return {
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": 15,
        # kwok nodes carry this taint; real nodes do not, and the toleration is harmless there.
        "tolerations": [
            {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
        ],
        "containers": [
            {
                "name": container,
                "image": "tideshift:demo",
                "resources": {
                    "requests": {
                        "cpu": f"{int(cpu * 1000)}m",
                        "memory": f"{int(memory_gib * 1024)}Mi",
                    }
                },
            }
        ],
    }
