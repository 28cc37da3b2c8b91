"""The engines' pins, files and webhook rewriting, without a cluster: the build script and the
launcher agree, and a missing binary or CRD says what to run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tideshift.services.devcluster import cli
from tideshift.services.devcluster.cluster import ClusterOptions, ClusterStartError, LocalCluster
from tideshift.services.devcluster.engine_manifests import (
    EngineManifestError,
    load_crds,
    loopback_webhooks,
    webhook_configuration,
    with_conversion_webhook,
)
from tideshift.services.devcluster.engines import (
    ENGINE_NAMES,
    ENGINES,
    KUBERAY_VERSION,
    KUEUE_VERSION,
    TRAINING_OPERATOR_VERSION,
    MissingEnginesError,
    default_engines_dir,
    parse_engine_list,
    require_engines,
    stale_engine_files,
)
from tideshift.services.devcluster.nodes import default_nodes
from tideshift.services.devcluster.processes import load_state, pid_alive, state_processes

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "cluster" / "build_engines.sh"


def test_build_script_and_launcher_pin_the_same_engine_versions() -> None:
    pins = dict(re.findall(r'^(\w+_VERSION)="(v[^"]+)"', BUILD_SCRIPT.read_text(), re.M))
    assert pins == {
        "KUEUE_VERSION": KUEUE_VERSION,
        "TRAINING_OPERATOR_VERSION": TRAINING_OPERATOR_VERSION,
        "KUBERAY_VERSION": KUBERAY_VERSION,
    }
    for engine in ENGINES.values():
        assert f"[{engine.name}]={engine.binary}" in BUILD_SCRIPT.read_text()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"TIDESHIFT_ENGINES_DIR": "/opt/engines"}, Path("/opt/engines")),
        ({"TIDESHIFT_CACHE_DIR": "/c", "HOME": "/h"}, Path("/c/engines")),
        ({"HOME": "/h"}, Path("/h/.cache/tideshift/engines")),
    ],
)
def test_engines_dir_follows_the_build_script_rules(
    environ: dict[str, str], expected: Path
) -> None:
    assert default_engines_dir(environ) == expected


def _fake_engine(root: Path, name: str, *, crds: bool) -> None:
    engine = ENGINES[name]
    (root / "bin" / ".stamps").mkdir(parents=True, exist_ok=True)
    binary = root / "bin" / engine.binary
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (root / "bin" / ".stamps" / engine.binary).write_text(f"{engine.binary} {engine.version}")
    (root / "manifests" / ".stamps").mkdir(parents=True, exist_ok=True)
    (root / "manifests" / ".stamps" / name).write_text(f"{name} {engine.version}")
    (root / "manifests" / name / "crds").mkdir(parents=True, exist_ok=True)
    if crds:
        (root / "manifests" / name / "crds" / "a.yaml").write_text("kind: CustomResourceDefinition")


def test_a_missing_binary_or_crd_names_the_build_script(tmp_path: Path) -> None:
    _fake_engine(tmp_path, "kueue", crds=True)
    _fake_engine(tmp_path, "kuberay", crds=False)  # binary, but its CRDs were never copied
    assert stale_engine_files(tmp_path, ["kueue"]) == []
    with pytest.raises(MissingEnginesError) as raised:
        require_engines(tmp_path, ENGINE_NAMES)
    message = str(raised.value)
    assert "tests/cluster/build_engines.sh" in message
    assert "--without" in message
    assert f"training-operator {TRAINING_OPERATOR_VERSION} binary" in message
    assert f"kuberay {KUBERAY_VERSION} CRDs" in message
    assert "kueue" not in message.split("(")[1].split(")", maxsplit=1)[0]


def test_a_binary_stamped_with_another_version_is_stale(tmp_path: Path) -> None:
    _fake_engine(tmp_path, "kueue", crds=True)
    (tmp_path / "bin" / ".stamps" / "kueue").write_text("kueue v0.1.0 recipe=1")
    assert stale_engine_files(tmp_path, ["kueue"]) == [f"kueue {KUEUE_VERSION} binary bin/kueue"]


def test_up_without_built_engines_fails_before_starting_anything(
    k8s_bin_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "state"
    argv = ["cluster", "up", "--state-dir", str(state_dir), "--bin-dir", str(k8s_bin_dir)]
    assert cli.main([*argv, "--engines-dir", str(tmp_path / "none")]) == 1
    error = capsys.readouterr().err
    assert "build_engines.sh" in error and "kueue" in error
    assert not (state_dir / "state.json").exists()


def test_without_parses_engine_names_and_refuses_unknown_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse_engine_list("kueue, kuberay") == ["kueue", "kuberay"]
    with pytest.raises(ValueError, match="known: kueue, training-operator, kuberay"):
        parse_engine_list("volcano")
    with pytest.raises(SystemExit):
        cli.main(["cluster", "up", "--without", "volcano"])
    assert "unknown engine volcano" in capsys.readouterr().err
    assert cli._engines([]) == list(ENGINE_NAMES)
    assert cli._engines([["kuberay"], ["kueue"]]) == ["training-operator"]


def test_webhooks_point_at_loopback_with_the_engine_ca() -> None:
    configuration = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            {
                "name": "mjob.kb.io",
                "clientConfig": {"service": {"name": "svc", "path": "/mutate-batch-v1-job"}},
                "rules": [{"resources": ["jobs"]}],
            },
            {
                "name": "mpod.kb.io",
                "clientConfig": {"service": {"name": "svc", "path": "/mutate--v1-pod"}},
            },
        ],
    }
    rewritten = loopback_webhooks(
        configuration,
        name="kueue-mutating-webhook-configuration",
        base_url="https://127.0.0.1:9443",
        ca_pem=b"CA",
        keep=lambda path: path.endswith("-batch-v1-job"),
    )
    assert rewritten["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    assert [webhook["name"] for webhook in rewritten["webhooks"]] == ["mjob.kb.io"]
    assert rewritten["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-batch-v1-job",
        "caBundle": "Q0E=",
    }
    assert rewritten["webhooks"][0]["rules"] == [{"resources": ["jobs"]}]

    crd = {"kind": "CustomResourceDefinition", "spec": {"group": "g"}}
    converted = with_conversion_webhook(crd, url="https://127.0.0.1:1/convert", ca_pem=b"CA")
    assert converted["spec"]["conversion"]["strategy"] == "Webhook"
    assert converted["spec"]["conversion"]["webhook"]["clientConfig"]["url"].endswith("/convert")
    assert "conversion" not in crd["spec"]


def test_a_crd_directory_without_crds_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("kind: ConfigMap\n")
    with pytest.raises(EngineManifestError, match="no CustomResourceDefinition"):
        load_crds(tmp_path)
    with pytest.raises(EngineManifestError, match="not found"):
        load_crds(tmp_path, only=["pytorchjobs.kubeflow.org"])
    (tmp_path / "y.yaml").write_text("kind: CustomResourceDefinition\n")
    with pytest.raises(EngineManifestError, match=r"y\.yaml has no name"):
        load_crds(tmp_path)
    (tmp_path / "y.yaml").write_text("kind: CustomResourceDefinition\nmetadata: {name: a.b}\n")
    with pytest.raises(EngineManifestError, match=r"a\.b in .*y\.yaml: spec must be a mapping"):
        load_crds(tmp_path)
    (tmp_path / "y.yaml").write_text("kind: [\n")
    with pytest.raises(EngineManifestError, match=r"y\.yaml is not valid YAML"):
        load_crds(tmp_path)


def test_a_webhook_configuration_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    kind = "ValidatingWebhookConfiguration"
    source = tmp_path / "manifests.yaml"
    good = {"apiVersion": "v1", "kind": kind, "webhooks": [{"clientConfig": {"service": {}}}]}
    assert webhook_configuration([good], kind, source) is good
    with pytest.raises(EngineManifestError, match=r"manifests\.yaml: apiVersion must be"):
        webhook_configuration([{**good, "apiVersion": None}], kind, source)
    for webhooks in ("x", ["x"], [{"clientConfig": "x"}], [{"clientConfig": {"service": 1}}]):
        with pytest.raises(EngineManifestError, match=f"{kind} in .*: webhooks must be a list"):
            webhook_configuration([{**good, "webhooks": webhooks}], kind, source)


def test_an_engine_that_exits_at_start_is_named_with_its_log_and_nothing_is_left_running(
    k8s_bin_dir: Path, engines_dir: Path, tmp_path: Path
) -> None:
    fake = tmp_path / "engines"
    (fake / "manifests" / ".stamps").mkdir(parents=True)
    shutil.copytree(engines_dir / "manifests" / "kuberay", fake / "manifests" / "kuberay")
    shutil.copy(engines_dir / "manifests" / ".stamps" / "kuberay", fake / "manifests" / ".stamps")
    _fake_engine(fake, "kuberay", crds=False)
    binary = fake / "bin" / ENGINES["kuberay"].binary
    binary.write_text("#!/bin/sh\necho 'refusing to start: a test' >&2\nexit 3\n")
    state_dir = tmp_path / "state"
    options = ClusterOptions(
        bin_dir=k8s_bin_dir,
        state_dir=state_dir,
        nodes=default_nodes(1, gpu_nodes=0),
        engines=["kuberay"],
        engines_dir=fake,
        workload_crds=False,
        storage=False,
        start_timeout=180.0,
    )
    with pytest.raises(ClusterStartError, match="kuberay exited with code 3") as raised:
        LocalCluster(options).start()
    assert "refusing to start: a test" in str(raised.value)
    records = state_processes(load_state(state_dir) or {})
    assert "kuberay" in {record.name for record in records}
    assert not any(pid_alive(record.pid) for record in records)
