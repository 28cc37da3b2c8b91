"""`helm lint` and `helm template` of charts/tideshift with default and non-default values."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.chart.chart_support import (
    CHART,
    SERVICES,
    by_kind,
    component,
    container_env,
    rbac_file_rules,
    render,
    render_error,
    run_helm,
    values_args,
)

STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/component",
    "helm.sh/chart",
)
KUBERNETES_SERVICES = ("watcher", "executor")


@pytest.fixture(scope="module")
def default_objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(tmp_path_factory.mktemp("default"))


def test_helm_lint_passes_strict_for_default_and_full_values(tmp_path: Path) -> None:
    run_helm("lint", "--strict", str(CHART))
    full = {
        "priorityClasses": {"create": True},
        "reactions": {"enabled": True, "script": "print('hello')\n"},
        "nats": {"bundled": {"persistence": {"enabled": False}}},
    }
    run_helm("lint", "--strict", str(CHART), *values_args(full, tmp_path))


def test_default_render_has_one_of_each_object_per_service(
    default_objects: list[dict[str, Any]],
) -> None:
    deployments = by_kind(default_objects, "Deployment")
    assert sorted(component(d) for d in deployments.values()) == sorted(SERVICES)
    replicas = {component(d): d["spec"]["replicas"] for d in deployments.values()}
    assert replicas == {"watcher": 1, "predictor": 1, "planner": 2, "executor": 2}
    for kind in ("ServiceAccount", "PodDisruptionBudget", "Service"):
        components = [component(obj) for obj in by_kind(default_objects, kind).values()]
        assert set(SERVICES) <= set(components), kind
    roles = by_kind(default_objects, "ClusterRole")
    assert sorted(component(role) for role in roles.values()) == sorted(KUBERNETES_SERVICES)
    assert len(by_kind(default_objects, "ClusterRoleBinding")) == 2
    assert [component(s) for s in by_kind(default_objects, "StatefulSet").values()] == ["nats"]
    assert not by_kind(default_objects, "PriorityClass")
    assert not [obj for obj in default_objects if component(obj) == "reactions"]


def test_every_object_carries_the_standard_labels(default_objects: list[dict[str, Any]]) -> None:
    for obj in default_objects:
        labels = obj["metadata"]["labels"]
        missing = [label for label in STANDARD_LABELS if label not in labels]
        assert not missing, f"{obj['kind']}/{obj['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/instance"] == "ts"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_deployments_probe_health_and_run_locked_down(
    default_objects: list[dict[str, Any]],
) -> None:
    for deployment in by_kind(default_objects, "Deployment").values():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["args"] == ["run", component(deployment)]
        assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
        assert container["resources"]["requests"]["cpu"]
        assert container["resources"]["limits"]["memory"]
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert pod["securityContext"]["runAsNonRoot"] is True
        # The read-only root filesystem needs a writable /tmp.
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        # The predictor's image adds the `forecast` extra to the core image (the Dockerfile).
        repository = "tideshift-predictor" if component(deployment) == "predictor" else "tideshift"
        assert container["image"] == f"ghcr.io/tideshift/{repository}:0.1.0"


def test_only_the_watcher_and_executor_get_an_api_token(
    default_objects: list[dict[str, Any]],
) -> None:
    for deployment in by_kind(default_objects, "Deployment").values():
        pod = deployment["spec"]["template"]["spec"]
        expected = component(deployment) in KUBERNETES_SERVICES
        assert pod["automountServiceAccountToken"] is expected, component(deployment)
        assert pod["serviceAccountName"] == f"ts-tideshift-{component(deployment)}"


def test_cluster_roles_carry_exactly_the_rules_of_files_rbac_yaml(
    default_objects: list[dict[str, Any]],
) -> None:
    rules = rbac_file_rules()
    assert set(KUBERNETES_SERVICES) <= set(rules), "files/rbac.yaml lacks a service's role"
    roles = {component(role): role for role in by_kind(default_objects, "ClusterRole").values()}
    bindings = by_kind(default_objects, "ClusterRoleBinding")
    for service in KUBERNETES_SERVICES:
        assert roles[service]["rules"] == rules[service]
        binding = bindings[roles[service]["metadata"]["name"]]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": f"ts-tideshift-{service}", "namespace": "tideshift"}
        ]
        for rule in roles[service]["rules"]:
            assert "secrets" not in rule.get("resources", []), service
            assert "*" not in rule.get("verbs", []) + rule.get("resources", []), service


def test_nats_url_comes_from_a_secret_pointing_at_the_bundled_server(
    default_objects: list[dict[str, Any]],
) -> None:
    secret = by_kind(default_objects, "Secret")["ts-tideshift-nats"]
    assert secret["stringData"] == {"url": "nats://ts-tideshift-nats.tideshift.svc:4222"}
    for deployment in by_kind(default_objects, "Deployment").values():
        env = container_env(deployment)
        assert env["TIDESHIFT_NATS_URL"] == {
            "secretKeyRef": {"name": "ts-tideshift-nats", "key": "url"}
        }
        assert env["TIDESHIFT_INSTANCE"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["TIDESHIFT_HEALTH_PORT"] == "8080"
        assert "TIDESHIFT_NATS_CREDENTIALS" not in env


def test_bundled_nats_runs_jetstream_and_mqtt_on_a_claim(
    default_objects: list[dict[str, Any]],
) -> None:
    statefulset = by_kind(default_objects, "StatefulSet")["ts-tideshift-nats"]
    config = by_kind(default_objects, "ConfigMap")["ts-tideshift-nats-config"]["data"]["nats.conf"]
    assert "jetstream {" in config and "store_dir: /data" in config
    assert "mqtt {" in config and "port: 1883" in config
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert statefulset["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    service_ports = by_kind(default_objects, "Service")["ts-tideshift-nats"]["spec"]["ports"]
    assert {port["name"]: port["port"] for port in service_ports} == {
        "client": 4222,
        "mqtt": 1883,
        "monitor": 8222,
    }


def test_external_nats_with_credentials_from_an_existing_secret(tmp_path: Path) -> None:
    objects = render(
        tmp_path,
        {"nats": {"bundled": {"enabled": False}, "existingSecret": "corp-nats"}},
    )
    assert not by_kind(objects, "StatefulSet")
    assert not by_kind(objects, "Secret"), "the user's Secret is used, not a new one"
    for deployment in by_kind(objects, "Deployment").values():
        env = container_env(deployment)
        assert env["TIDESHIFT_NATS_URL"] == {"secretKeyRef": {"name": "corp-nats", "key": "url"}}
        assert env["TIDESHIFT_NATS_CREDENTIALS"] == ("/var/run/secrets/tideshift/nats/nats.creds")
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["nats-credentials"]["secret"]["secretName"] == "corp-nats"


def test_external_nats_url_goes_into_the_chart_secret(tmp_path: Path) -> None:
    objects = render(
        tmp_path,
        {
            "nats": {
                "bundled": {"enabled": False},
                "url": "tls://nats.example:4222",
                "credentials": "-----BEGIN NATS USER JWT-----\n",
            }
        },
    )
    secret = by_kind(objects, "Secret")["ts-tideshift-nats"]
    assert secret["stringData"]["url"] == "tls://nats.example:4222"
    assert secret["stringData"]["nats.creds"].startswith("-----BEGIN NATS USER JWT")


def test_config_values_become_tideshift_environment_variables(tmp_path: Path) -> None:
    objects = render(
        tmp_path,
        {
            "config": {"log_level": "DEBUG"},
            "executor": {"config": {"dry_run": True, "max_step": 4, "log_level": "WARNING"}},
            "watcher": {"config": {"namespace": "shop", "resync_seconds": 600}},
            "healthPort": 9090,
        },
    )
    deployments = {component(d): d for d in by_kind(objects, "Deployment").values()}
    executor = container_env(deployments["executor"])
    assert executor["TIDESHIFT_DRY_RUN"] == "true"
    assert executor["TIDESHIFT_MAX_STEP"] == "4"
    assert executor["TIDESHIFT_LOG_LEVEL"] == "WARNING", "a service's own config wins"
    watcher = container_env(deployments["watcher"])
    assert watcher["TIDESHIFT_NAMESPACE"] == "shop"
    assert watcher["TIDESHIFT_RESYNC_SECONDS"] == "600"
    assert watcher["TIDESHIFT_LOG_LEVEL"] == "DEBUG"
    assert watcher["TIDESHIFT_MAX_MESSAGE_BYTES"] == "1048576", "no float notation"
    assert "TIDESHIFT_KUBECONFIG" not in watcher, "null settings are left to the service"
    assert watcher["TIDESHIFT_HEALTH_PORT"] == "9090"
    port = deployments["watcher"]["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    assert port["containerPort"] == 9090
    checksums = {
        name: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for name, d in deployments.items()
    }
    default_checksums = {
        component(d): d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for d in by_kind(render(tmp_path), "Deployment").values()
    }
    assert checksums["executor"] != default_checksums["executor"], "config change rolls pods"


def test_priority_classes_let_serving_preempt_training(tmp_path: Path) -> None:
    objects = render(tmp_path, {"priorityClasses": {"create": True}})
    classes = by_kind(objects, "PriorityClass")
    serving, training = classes["tideshift-serving"], classes["tideshift-training"]
    assert serving["value"] > training["value"]
    assert serving["preemptionPolicy"] == "PreemptLowerPriority"
    assert training["preemptionPolicy"] == "Never"
    assert not serving["globalDefault"] and not training["globalDefault"]


def test_priority_classes_in_the_wrong_order_are_refused(tmp_path: Path) -> None:
    error = render_error(
        tmp_path,
        {"priorityClasses": {"create": True, "training": {"value": 200000}}},
    )
    assert "priorityClasses.training.value must be lower than" in error


def test_reaction_script_runs_as_a_subscriber_deployment(tmp_path: Path) -> None:
    script = (Path(CHART).parents[1] / "examples" / "reactions" / "chat_webhook.py").read_text()
    objects = render(
        tmp_path,
        {
            "reactions": {
                "enabled": True,
                "script": script,
                "extraEnv": [{"name": "WEBHOOK_URL", "value": "https://chat.example/hook"}],
            }
        },
    )
    config_map = by_kind(objects, "ConfigMap")["ts-tideshift-reactions"]
    assert config_map["data"]["reaction.py"].strip() == script.strip()
    deployment = by_kind(objects, "Deployment")["ts-tideshift-reactions"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python", "/etc/tideshift/reactions/reaction.py"]
    env = container_env(deployment)
    assert env["TIDESHIFT_NATS_URL"]["secretKeyRef"]["name"] == "ts-tideshift-nats"
    assert env["WEBHOOK_URL"] == "https://chat.example/hook"
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_reactions_without_a_script_are_refused(tmp_path: Path) -> None:
    error = render_error(tmp_path, {"reactions": {"enabled": True}})
    assert "reactions.enabled needs reactions.script" in error


def test_external_nats_without_a_url_is_refused(tmp_path: Path) -> None:
    error = render_error(tmp_path, {"nats": {"bundled": {"enabled": False}}})
    assert "nats.url (or nats.existingSecret) is required" in error


def test_a_disabled_service_leaves_no_object_behind(tmp_path: Path) -> None:
    objects = render(tmp_path, {"predictor": {"enabled": False}})
    assert not [obj for obj in objects if component(obj) == "predictor"]
    assert len(by_kind(objects, "Deployment")) == 3


def test_nats_without_persistence_uses_an_empty_dir(tmp_path: Path) -> None:
    objects = render(tmp_path, {"nats": {"bundled": {"persistence": {"enabled": False}}}})
    statefulset = by_kind(objects, "StatefulSet")["ts-tideshift-nats"]
    assert "volumeClaimTemplates" not in statefulset["spec"]
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}


def test_image_and_names_are_configurable(tmp_path: Path) -> None:
    objects = render(
        tmp_path,
        {
            "image": {"repository": "registry.example/ts", "tag": "1.2.3"},
            "predictor": {"image": {"repository": "registry.example/ts-predictor"}},
            "planner": {"image": {"tag": "1.2.4"}},
            "fullnameOverride": "tide",
        },
        release="prod",
    )
    deployments = by_kind(objects, "Deployment")
    assert sorted(deployments) == sorted(f"tide-{service}" for service in SERVICES)
    images = {
        component(deployment): deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        for deployment in deployments.values()
    }
    assert images == {
        "watcher": "registry.example/ts:1.2.3",
        "predictor": "registry.example/ts-predictor:1.2.3",
        "planner": "registry.example/ts:1.2.4",
        "executor": "registry.example/ts:1.2.3",
    }


def render_notes(tmp_path: Path, values: dict[str, Any], *, namespace: str) -> str:
    """NOTES.txt as `helm install` would print it, rendered without a cluster: a copy of the
    chart wraps it in a named template and outputs that through a ConfigMap."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_preview.tpl").write_text(
        '{{- define "notes.preview" -}}\n' + notes + "{{- end -}}\n"
    )
    (chart / "templates" / "notes-preview.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-preview\ndata:\n"
        '  notes: |\n{{ include "notes.preview" . | indent 4 }}\n'
    )
    result = run_helm(
        "template",
        "ts",
        str(chart),
        "--namespace",
        namespace,
        "--show-only",
        "templates/notes-preview.yaml",
        *values_args(values, tmp_path),
    )
    return str(yaml.safe_load(result.stdout)["data"]["notes"])


def test_notes_tell_how_to_tail_events_and_where_metrics_are(tmp_path: Path) -> None:
    notes = render_notes(
        tmp_path, {"nats": {"bundled": {"mqtt": {"port": 11883}}}}, namespace="shop"
    )
    assert "tideshift events tail --nats-url nats://127.0.0.1:4222" in notes
    assert "tideshift events tail --mqtt --mqtt-url mqtt://127.0.0.1:11883" in notes
    assert "kubectl -n shop port-forward svc/ts-tideshift-nats 4222:4222 11883:11883" in notes
    assert "http://ts-tideshift-planner-metrics.shop.svc:8080/metrics" in notes
    assert "delete pvc -l app.kubernetes.io/instance=ts" in notes, "Retain claims are explained"


def test_notes_say_how_to_see_why_and_how_to_leave_observe_mode(tmp_path: Path) -> None:
    acting = render_notes(tmp_path / "act", {}, namespace="shop")
    assert "tideshift explain deploy/<name> -n <namespace>" in acting
    assert "Observe mode" not in acting
    observing = render_notes(
        tmp_path / "observe", {"executor": {"config": {"mode": "observe"}}}, namespace="shop"
    )
    assert "helm upgrade ts charts/tideshift -n shop --reuse-values" in observing
    assert "--set executor.config.mode=act" in observing


def test_notes_for_external_nats_point_at_the_secret(tmp_path: Path) -> None:
    notes = render_notes(
        tmp_path,
        {"nats": {"bundled": {"enabled": False}, "url": "nats://nats.example:4222"}},
        namespace="shop",
    )
    assert "tideshift events tail --nats-url <the NATS URL in Secret ts-tideshift-nats" in notes
    assert "port-forward svc/" not in notes


def test_rendered_manifests_are_valid_yaml_documents(tmp_path: Path) -> None:
    result = run_helm("template", "ts", str(CHART))
    documents = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert all({"apiVersion", "kind", "metadata"} <= set(doc) for doc in documents)


def test_the_readme_example_values_install_cleanly(tmp_path: Path) -> None:
    readme = (CHART / "README.md").read_text()
    example = readme.split("# tideshift-values.yaml\n", 1)[1].split("```", 1)[0]
    values = yaml.safe_load(example)
    objects = render(tmp_path, values)
    deployments = {component(d): d for d in by_kind(objects, "Deployment").values()}
    planner_env = container_env(deployments["planner"])
    assert '"capacity_rps":40' in planner_env["TIDESHIFT_SERVING"]
    assert deployments["planner"]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example.com/tideshift:0.1.0"
    )
    assert len(by_kind(objects, "PriorityClass")) == 2
