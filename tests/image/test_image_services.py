"""Every chart service runs from the image, exactly as its rendered Deployment runs it.

The chart is installed into the local control plane (whose kwok nodes run no containers), and
each Deployment's container is then run with podman: its image (the predictor's for the
predictor, the core image, without forecasters, for the others), command and args, the
environment resolved from the chart's Secret, the pod's user and group, a read-only root
filesystem, the dropped capabilities, no privilege escalation and the /tmp emptyDir. The
watcher and executor act as their chart ServiceAccount through a TokenRequest kubeconfig
mounted read-only. Containers share the host's loopback, so each gets its own health port.
"""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.image.chart_pods import container_environment, installed_deployments
from tests.image.podman_cli import podman
from tests.k8s.cluster_objects import collection, create, pod_template, wait_until
from tests.unit.chart.chart_support import CHART, SERVICES, run_helm, values_args
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port

pytestmark = pytest.mark.k8s

WAIT = 120.0
KUBECONFIG_IN_CONTAINER = "/var/run/secrets/tideshift/kubeconfig"
# The labelled Deployment the pipeline sizes: 150 rps of simulated demand, 100 rps a replica.
START_REPLICAS = 12
SERVING = {
    "tideshift.io/capacity-rps": "100",
    "tideshift.io/min-replicas": "1",
    "tideshift.io/max-replicas": "26",
    "tideshift.io/lead-time-seconds": "0",
    "tideshift.io/stabilization-seconds": "1",
}


def serving_deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "labels": {"tideshift.io/role": "serving"},
            "annotations": SERVING,
        },
        "spec": {
            "replicas": START_REPLICAS,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template({"app": name}),
        },
    }


def run_arguments(pod: dict[str, Any], env: dict[str, str], mounts: list[str]) -> list[str]:
    """`podman run` options equivalent to the pod spec (those a container runtime applies)."""
    container = pod["containers"][0]
    pod_security, security = pod["securityContext"], container["securityContext"]
    args = [
        "--network",
        "host",
        "--user",
        f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}",
    ]
    if security.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    for capability in security["capabilities"]["drop"]:
        args += ["--cap-drop", capability]
    if security.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        assert "emptyDir" in volume, f"volume {mount['name']}: only emptyDir is run here"
        size = volume["emptyDir"]["sizeLimit"].replace("Mi", "m")
        args += ["--tmpfs", f"{mount['mountPath']}:rw,size={size},mode=1777"]
    for mount in mounts:
        args += ["--volume", mount]
    for name, value in env.items():
        args += ["--env", f"{name}={value}"]
    if "command" in container:
        args += ["--entrypoint", container["command"][0]]
    return args


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def container(name: str, image: str, options: list[str], args: list[str]) -> Iterator[str]:
    """A detached container, stopped (SIGTERM, the pod's grace period) and removed at the end."""
    podman("run", "--detach", "--name", name, *options, image, *args)
    try:
        yield name
    finally:
        podman("stop", "--time", "40", name, check=False)
        podman("rm", "--force", name, check=False)


def logs(name: str) -> str:
    answer = podman("logs", name, check=False)
    return answer.stdout + answer.stderr


def state(name: str) -> tuple[bool, int]:
    answer = podman("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name)
    running, code = answer.stdout.split()
    return running == "true", int(code)


def helm_test(
    release: str, kubeconfig: Path, namespace: str, api: Any, image: str, ports: dict[str, int]
) -> None:
    """The chart's `helm test` Pod, run from the image against the running release.

    kwok would only pretend to run it, so its container runs here; the metrics Services' DNS
    names it checks become this host's ports of the same services.
    """
    hooks = run_helm("get", "hooks", release, "-n", namespace, env={"KUBECONFIG": str(kubeconfig)})
    pods = [doc for doc in yaml.safe_load_all(hooks.stdout) if doc and doc["kind"] == "Pod"]
    assert [pod["metadata"]["annotations"]["helm.sh/hook"] for pod in pods] == ["test"]
    pod = pods[0]["spec"]
    check = pod["containers"][0]
    assert check["image"] == image
    env = container_environment(pods[0]["metadata"]["name"], check, api=api, namespace=namespace)
    urls = dict(item.split("=", 1) for item in env["TIDESHIFT_CHECK_SERVICES"].split())
    prefix = release if "tideshift" in release else f"{release}-tideshift"
    assert urls == {
        service: f"http://{prefix}-{service}-metrics.{namespace}.svc:8080" for service in SERVICES
    }
    env["TIDESHIFT_CHECK_SERVICES"] = " ".join(
        f"{service}=http://127.0.0.1:{ports[service]}" for service in SERVICES
    )
    options = run_arguments(pod, env, [])
    args = check["command"][1:] + check["args"]
    done = podman("run", "--rm", *options, image, *args, check=False, timeout=180)
    assert done.returncode == 0, f"helm test pod failed:\n{done.stdout}{done.stderr}"
    assert "a planner leads" in done.stdout
    assert "plan.decided" in done.stdout


def test_every_service_runs_from_the_image_as_the_chart_runs_it(
    image: str,
    predictor_image: str,
    k8s_cluster: Any,
    k8s_namespace: str,
    nats_server: EmbeddedNats,
    tmp_path: Path,
) -> None:
    release = f"ts-{uuid.uuid4().hex[:6]}"
    repository, tag = image.rsplit(":", 1)
    predictor_repository, predictor_tag = predictor_image.rsplit(":", 1)
    images = {service: image for service in SERVICES} | {"predictor": predictor_image}
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "nats": {"bundled": {"enabled": False}, "url": nats_server.url},
        "predictor": {
            "image": {"repository": predictor_repository, "tag": predictor_tag},
            "config": {
                "metric_source": "sim",
                "sim_peak_rps": 150,
                "sim_trough_rps": 150,
                "workloads": [{"namespace": k8s_namespace, "name": "web"}],
            },
        },
        "planner": {"config": {"tick_seconds": 1}},
    }
    kube_env = {"KUBECONFIG": str(k8s_cluster.kubeconfig)}
    run_helm(
        "install",
        release,
        str(CHART),
        "-n",
        k8s_namespace,
        *values_args(values, tmp_path),
        env=kube_env,
    )
    try:
        deployments = installed_deployments(k8s_cluster.kubeconfig, release, k8s_namespace)
        assert set(deployments) == set(SERVICES)
        names = {service: f"{release}-{service}" for service in SERVICES}
        ports = {service: free_port("127.0.0.1") for service in SERVICES}
        with contextlib.ExitStack() as stack:
            api = stack.enter_context(k8s_cluster.api_client())
            for service in SERVICES:
                deployment = deployments[service]
                pod = deployment["spec"]["template"]["spec"]
                assert pod["containers"][0]["image"] == images[service]
                env = container_environment(
                    f"{deployment['metadata']['name']}-local",
                    pod["containers"][0],
                    api=api,
                    namespace=k8s_namespace,
                )
                env["TIDESHIFT_HEALTH_PORT"] = str(ports[service])
                mounts = []
                if pod["automountServiceAccountToken"]:
                    config = k8s_cluster.service_account_kubeconfig(
                        k8s_namespace,
                        pod["serviceAccountName"],
                        tmp_path / f"{service}.kubeconfig",
                        create=False,
                    )
                    config.chmod(0o444)
                    mounts.append(f"{config}:{KUBECONFIG_IN_CONTAINER}:ro")
                    env["KUBECONFIG"] = KUBECONFIG_IN_CONTAINER
                options = run_arguments(pod, env, mounts)
                args = pod["containers"][0]["args"]
                stack.enter_context(container(names[service], images[service], options, args))
            deadline = time.monotonic() + WAIT
            pending = set(SERVICES)
            while pending and time.monotonic() < deadline:
                for service in sorted(pending):
                    running, code = state(names[service])
                    assert running, f"{service} exited {code}:\n{logs(names[service])}"
                    if ready(ports[service]):
                        pending.discard(service)
                time.sleep(0.5)
            tails = {s: logs(names[s])[-3000:] for s in sorted(pending)}
            assert not pending, f"not ready within {WAIT:.0f}s: {tails}"
            # The pipeline, end to end: the watcher announces the labelled Deployment, the
            # predictor forecasts it, the planner sizes it and the executor scales it down.
            admin = KubeHttp(api)
            create(admin, collection("Deployment", k8s_namespace), serving_deployment("web"))
            path = f"/apis/apps/v1/namespaces/{k8s_namespace}/deployments/web"
            wait_until(
                lambda: admin.json("GET", path)["spec"]["replicas"] < START_REPLICAS,
                timeout=WAIT,
                what=f"web scaled down from {START_REPLICAS} by the executor's container",
            )
            for service in SERVICES:
                assert ready(ports[service]), f"{service} still ready after scaling"
            helm_test(release, k8s_cluster.kubeconfig, k8s_namespace, api, image, ports)
            for service in SERVICES:
                podman("stop", "--time", "40", names[service])
            codes = {service: state(names[service])[1] for service in SERVICES}
        assert codes == dict.fromkeys(SERVICES, 0), "every service drains and exits 0 on SIGTERM"
    finally:
        run_helm("uninstall", release, "-n", k8s_namespace, env=kube_env, check=False)
