"""The chart installed as a user installs it, on the real cluster: `helm install` with the
bundled NATS (logins on, every service a pod of the locally built images), every workload
ready, `helm test` green, `helm upgrade` from observe to act rolled out, then `helm uninstall`
leaving nothing of the release behind; and, with the bundled NATS as a three-server cluster,
install and `helm test` again.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures.requirements import REPOSITORY
from tests.real.realcluster import IMAGE, PREDICTOR_IMAGE, RealCluster, _script

pytestmark = [pytest.mark.real, pytest.mark.timeout(2400)]

CHART = REPOSITORY / "charts" / "tideshift"
RELEASE = "tideshift"
READY_TIMEOUT_S = 300
GONE_TIMEOUT_S = 120.0
# Namespaced kinds the chart creates (and the pods and jobs' pods they lead to).
NAMESPACED_KINDS = (
    "pods,services,endpoints,secrets,configmaps,persistentvolumeclaims,serviceaccounts,"
    "roles,rolebindings,deployments,statefulsets,replicasets,jobs,poddisruptionbudgets"
)
CLUSTER_KINDS = "clusterroles,clusterrolebindings,priorityclasses,persistentvolumes"
# What Kubernetes itself puts in every namespace.
NAMESPACE_DEFAULTS = {"ConfigMap/kube-root-ca.crt", "ServiceAccount/default"}


def _repo_tag(image: str) -> tuple[str, str]:
    repository, _, tag = image.rpartition(":")
    return repository, tag


class Helm:
    """helm against the real cluster, its caches and settings in the cluster's state dir."""

    def __init__(self, cluster: RealCluster, namespace: str) -> None:
        state = cluster.kubeconfig.parent
        self.binary = cluster.kubectl_bin.parent / "helm"
        self.namespace = namespace
        self.env = {
            **cluster.env,
            "KUBECONFIG": str(cluster.kubeconfig),
            "HELM_CACHE_HOME": str(state / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(state / "helm" / "config"),
            "HELM_DATA_HOME": str(state / "helm" / "data"),
        }

    def __call__(self, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.binary), "--namespace", self.namespace, *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
        return done


def _values(cluster: RealCluster, nats_replicas: int) -> list[str]:
    nats_image = _script(cluster.env, "nats-image", timeout=60).stdout.strip()
    assert nats_image, "cluster.sh nats-image printed nothing"
    image, tag = _repo_tag(IMAGE)
    predictor, predictor_tag = _repo_tag(PREDICTOR_IMAGE)
    nats, nats_tag = _repo_tag(nats_image)
    return [
        f"image.repository={image}",
        f"image.tag={tag}",
        "image.pullPolicy=Never",
        f"predictor.image.repository={predictor}",
        f"predictor.image.tag={predictor_tag}",
        "nats.auth.enabled=true",
        "nats.bundled.enabled=true",
        f"nats.bundled.replicas={nats_replicas}",
        f"nats.bundled.image.repository={nats}",
        f"nats.bundled.image.tag={nats_tag}",
        "nats.bundled.image.pullPolicy=Never",
        "nats.bundled.persistence.enabled=false",  # no storage provisioner in this cluster
        "executor.config.mode=observe",
        # no Prometheus in this cluster: the predictor's simulated source, as real_node.sh
        "predictor.config.metric_source=sim",
        "predictor.config.sim_peak_rps=150",
        "predictor.config.sim_trough_rps=150",
        "predictor.config.workloads[0].namespace=default",
        "predictor.config.workloads[0].name=web",
    ]


def _set_args(values: list[str]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def _workloads(cluster: RealCluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.json(
        "get",
        "deployments,statefulsets",
        "-n",
        namespace,
        "-l",
        f"app.kubernetes.io/instance={RELEASE}",
    )["items"]
    return items


def _assert_all_ready(cluster: RealCluster, namespace: str) -> list[str]:
    """Waits for every Deployment and StatefulSet of the release to finish its rollout."""
    workloads = _workloads(cluster, namespace)
    names = sorted(f"{w['kind'].lower()}/{w['metadata']['name']}" for w in workloads)
    assert any(n.startswith("statefulset/") for n in names), f"no bundled NATS: {names}"
    for name in names:
        cluster.kubectl(
            "rollout",
            "status",
            name,
            "-n",
            namespace,
            f"--timeout={READY_TIMEOUT_S}s",
            timeout=READY_TIMEOUT_S + 30,
        )
    for workload in _workloads(cluster, namespace):
        wanted = workload["spec"].get("replicas", 1)
        ready = workload["status"].get("readyReplicas", 0)
        assert ready == wanted, f"{workload['metadata']['name']}: {ready}/{wanted} ready"
    pods = cluster.json("get", "pods", "-n", namespace, "-o", "wide")["items"]
    images = {c["image"] for p in pods for c in p["spec"]["containers"]}
    assert IMAGE in images, f"no pod of {IMAGE}: {images}"
    return names


def _leftovers(cluster: RealCluster, namespace: str) -> list[str]:
    items = cluster.json("get", NAMESPACED_KINDS, "-n", namespace)["items"]
    # The chart's test pod is a hook (helm never deletes hooks on uninstall): its
    # hook-delete-policy hook-succeeded removes it once `helm test` passed, so it counts too.
    left = {f"{i['kind']}/{i['metadata']['name']}" for i in items} - NAMESPACE_DEFAULTS
    for item in cluster.json("get", CLUSTER_KINDS)["items"]:
        meta = item["metadata"]
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if (
            labels.get("app.kubernetes.io/instance") == RELEASE
            or annotations.get("meta.helm.sh/release-name") == RELEASE
            or annotations.get("meta.helm.sh/release-namespace") == namespace
        ):
            left.add(f"{item['kind']}/{meta['name']}")
    return sorted(left)


def _assert_nothing_left(cluster: RealCluster, namespace: str) -> None:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    left = _leftovers(cluster, namespace)
    while left and time.monotonic() < deadline:
        cluster.kubectl(
            "wait",
            "--for=delete",
            "pods",
            "--all",
            "-n",
            namespace,
            "--timeout=10s",
            check=False,
            timeout=30,
        )
        left = _leftovers(cluster, namespace)
    assert not left, f"helm uninstall left behind: {left}"


@pytest.fixture
def namespace(real_cluster: RealCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"real-helm-{request.node.name.rsplit('_', 1)[-1]}".lower()[:40]
    real_cluster.kubectl("create", "namespace", name)
    yield name
    real_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _install_and_test(cluster: RealCluster, helm: Helm, nats_replicas: int) -> dict[str, float]:
    timings: dict[str, float] = {}
    started = time.monotonic()
    helm(
        "install",
        RELEASE,
        str(CHART),
        *_set_args(_values(cluster, nats_replicas)),
        "--wait",
        f"--timeout={READY_TIMEOUT_S}s",
    )
    names = _assert_all_ready(cluster, helm.namespace)
    nats = cluster.json(
        "get", "statefulsets", "-n", helm.namespace, "-l", f"app.kubernetes.io/instance={RELEASE}"
    )["items"]
    assert [s["status"].get("readyReplicas") for s in nats] == [nats_replicas], names
    timings["install_s"] = time.monotonic() - started
    started = time.monotonic()
    tested = helm("test", RELEASE, f"--timeout={READY_TIMEOUT_S}s")
    assert "Phase:" in tested.stdout and "Succeeded" in tested.stdout, tested.stdout
    # Its hook-delete-policy (hook-succeeded) leaves no test pod behind once it passed.
    test_pod = f"{RELEASE}-test-pipeline"
    cluster.kubectl(
        "wait", "--for=delete", f"pod/{test_pod}", "-n", helm.namespace, "--timeout=60s", timeout=90
    )
    pods = cluster.json("get", "pods", "-n", helm.namespace)["items"]
    assert test_pod not in {p["metadata"]["name"] for p in pods}, "helm test left its pod"
    timings["helm_test_s"] = time.monotonic() - started
    return timings


def _executor_mode(cluster: RealCluster, namespace: str) -> str:
    deployments = cluster.json(
        "get", "deployments", "-n", namespace, "-l", f"app.kubernetes.io/instance={RELEASE}"
    )["items"]
    executor = [d for d in deployments if d["metadata"]["name"].endswith("executor")]
    assert len(executor) == 1, [d["metadata"]["name"] for d in deployments]
    env = executor[0]["spec"]["template"]["spec"]["containers"][0].get("env", [])
    modes = [e.get("value") for e in env if e["name"].endswith("_MODE")]
    assert len(modes) == 1, env
    return str(modes[0])


def _uninstall(cluster: RealCluster, helm: Helm) -> float:
    started = time.monotonic()
    helm("uninstall", RELEASE, "--wait", f"--timeout={READY_TIMEOUT_S}s")
    _assert_nothing_left(cluster, helm.namespace)
    return time.monotonic() - started


def test_helm_install_test_upgrade_uninstall(real_cluster: RealCluster, namespace: str) -> None:
    helm = Helm(real_cluster, namespace)
    began = time.monotonic()
    timings = _install_and_test(real_cluster, helm, nats_replicas=1)
    assert _executor_mode(real_cluster, namespace) == "observe"

    started = time.monotonic()
    helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--reuse-values",
        "--set",
        "executor.config.mode=act",
        "--wait",
        f"--timeout={READY_TIMEOUT_S}s",
    )
    assert _executor_mode(real_cluster, namespace) == "act"
    _assert_all_ready(real_cluster, namespace)
    revision = helm("status", RELEASE, "-o", "json").stdout
    assert '"version":2' in revision.replace(" ", ""), revision[:500]
    timings["upgrade_s"] = time.monotonic() - started

    timings["uninstall_s"] = _uninstall(real_cluster, helm)
    timings["total_s"] = time.monotonic() - began
    real_cluster.timings["helm_lifecycle"] = timings  # type: ignore[assignment]
    print(f"\nhelm lifecycle timings (s): {timings}")


def test_helm_three_server_nats(real_cluster: RealCluster, namespace: str) -> None:
    helm = Helm(real_cluster, namespace)
    began = time.monotonic()
    timings = _install_and_test(real_cluster, helm, nats_replicas=3)
    timings["uninstall_s"] = _uninstall(real_cluster, helm)
    timings["total_s"] = time.monotonic() - began
    real_cluster.timings["helm_nats3"] = timings  # type: ignore[assignment]
    print(f"\nhelm three-server NATS timings (s): {timings}")
