"""Smoke test of the real cluster: real pods of the tideshift image spread over real nodes, a
Service in front of them, the Service's name resolved by CoreDNS from a pod, HTTP 200 through it.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from tests.real.realcluster import IMAGE, RealCluster

pytestmark = [pytest.mark.real, pytest.mark.timeout(2400)]

NAMESPACE = "real-smoke"
REQUESTS = 20

# Each replica serves its own pod name, so the probe can tell which backends answered.
WEB = f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {NAMESPACE}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
          labelSelector: {{matchLabels: {{app: web}}}}}}
      containers:
      - name: web
        image: {IMAGE}
        imagePullPolicy: Never
        command: [sh, -c, 'mkdir -p /tmp/www && hostname > /tmp/www/index.html &&
                          exec python -m http.server 8080 --directory /tmp/www']
        ports: [{{containerPort: 8080}}]
        readinessProbe: {{httpGet: {{path: /, port: 8080}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {NAMESPACE}}}
spec:
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080}}]
"""

PROBE_SCRIPT = textwrap.dedent(
    f"""
    import json, socket, urllib.request
    name = "web.{NAMESPACE}.svc.cluster.local"
    resolved = sorted({{a[4][0] for a in socket.getaddrinfo(name, 80, socket.AF_INET)}})
    short = sorted({{a[4][0] for a in socket.getaddrinfo("web", 80, socket.AF_INET)}})
    answers = []
    for _ in range({REQUESTS}):
        with urllib.request.urlopen(f"http://{{name}}/", timeout=5) as response:
            answers.append([response.status, response.read().decode().strip()])
    print(json.dumps({{"resolved": resolved, "short": short, "answers": answers}}))
    """
)

PROBE = f"""
apiVersion: batch/v1
kind: Job
metadata: {{name: probe, namespace: {NAMESPACE}}}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: probe
        image: {IMAGE}
        imagePullPolicy: Never
        command: [python, -c, {json.dumps(PROBE_SCRIPT)}]
"""


def ready_nodes(cluster: RealCluster) -> dict[str, str]:
    """Ready node name -> its InternalIP."""
    nodes: dict[str, str] = {}
    for node in cluster.json("get", "nodes")["items"]:
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        if conditions.get("Ready") == "True":
            addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
            nodes[node["metadata"]["name"]] = addresses["InternalIP"]
    return nodes


def test_pods_service_and_dns_on_real_nodes(real_cluster: RealCluster) -> None:
    cluster = real_cluster
    nodes = ready_nodes(cluster)
    assert len(nodes) == cluster.nodes
    assert len(set(nodes.values())) == cluster.nodes, nodes

    cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        cluster.kubectl("apply", "-f", "-", stdin=WEB)
        cluster.kubectl(
            "-n", NAMESPACE, "rollout", "status", "deployment/web", "--timeout=180s", timeout=200
        )
        pods: list[dict[str, Any]] = cluster.json("-n", NAMESPACE, "get", "pods", "-l", "app=web")[
            "items"
        ]
        assert len(pods) == 2
        placed = {pod["spec"]["nodeName"] for pod in pods}
        assert len(placed) == min(2, cluster.nodes), placed  # spread over real nodes
        pod_names = {pod["metadata"]["name"] for pod in pods}
        cluster_ip = cluster.json("-n", NAMESPACE, "get", "service", "web")["spec"]["clusterIP"]

        cluster.kubectl("apply", "-f", "-", stdin=PROBE)
        waited = cluster.kubectl(
            "-n",
            NAMESPACE,
            "wait",
            "--for=condition=complete",
            "job/probe",
            "--timeout=180s",
            timeout=200,
            check=False,
        )
        logs = cluster.kubectl("-n", NAMESPACE, "logs", "job/probe", check=False)
        assert waited.returncode == 0, f"probe job did not complete: {logs.stdout}{logs.stderr}"
        report = json.loads(logs.stdout.strip().splitlines()[-1])

        assert report["resolved"] == [cluster_ip]  # CoreDNS answered with the Service's IP
        assert report["short"] == [cluster_ip]  # and through the pod's search path
        statuses = {status for status, _ in report["answers"]}
        assert statuses == {200}
        # kube-proxy spread the requests over both replicas, on different nodes.
        assert {body for _, body in report["answers"]} == pod_names
    finally:
        cluster.kubectl(
            "delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s", timeout=150
        )
