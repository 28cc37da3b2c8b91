"""`tideshift dev cluster` and the launcher's guard rails: pins, flags, missing binaries, and
a full up/env/down cycle that must leave no process behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tideshift.services.devcluster import cli
from tideshift.services.devcluster.nodes import NodeSpec
from tideshift.services.devcluster.processes import load_state, pid_alive, state_processes
from tideshift.services.devcluster.versions import (
    BINARY_VERSIONS,
    ETCD_VERSION,
    HELM_VERSION,
    K8S_VERSION,
    KWOK_VERSION,
    MissingBinariesError,
    default_bin_dir,
    require_binaries,
)

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "cluster" / "build.sh"


def test_build_script_and_launcher_pin_the_same_versions() -> None:
    script = BUILD_SCRIPT.read_text()
    pins = dict(
        re.findall(
            r'^((?:K8S|ETCD|KWOK|HELM)_VERSION)="(?:\$\{TIDESHIFT_K8S_VERSION:-)?(v[^"}]+)',
            script,
            re.M,
        )
    )
    assert pins == {
        "K8S_VERSION": K8S_VERSION,
        "ETCD_VERSION": ETCD_VERSION,
        "KWOK_VERSION": KWOK_VERSION,
        "HELM_VERSION": HELM_VERSION,
    }


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"TIDESHIFT_K8S_BIN_DIR": "/opt/k8s"}, Path("/opt/k8s")),
        ({"TIDESHIFT_CACHE_DIR": "/c", "HOME": "/h"}, Path(f"/c/k8s-{K8S_VERSION}/bin")),
        ({"XDG_CACHE_HOME": "/x", "HOME": "/h"}, Path(f"/x/tideshift/k8s-{K8S_VERSION}/bin")),
        ({"HOME": "/h"}, Path(f"/h/.cache/tideshift/k8s-{K8S_VERSION}/bin")),
    ],
)
def test_bin_dir_follows_the_build_script_rules(environ: dict[str, str], expected: Path) -> None:
    assert default_bin_dir(environ) == expected


def test_missing_binaries_error_says_how_to_build(tmp_path: Path) -> None:
    (tmp_path / ".stamps").mkdir()
    (tmp_path / "etcd").write_text("")
    (tmp_path / "etcd").chmod(0o755)
    (tmp_path / ".stamps" / "etcd").write_text(f"etcd {ETCD_VERSION} recipe=1")

    with pytest.raises(MissingBinariesError) as raised:
        require_binaries(tmp_path)

    message = str(raised.value)
    assert "bash tests/cluster/build.sh" in message
    assert "kube-apiserver" in message
    assert "etcd," not in message  # the present, correctly stamped one is not blamed
    assert "\n" not in message
    require_binaries(tmp_path, ["etcd"])


def test_stale_stamp_counts_as_missing(tmp_path: Path) -> None:
    (tmp_path / ".stamps").mkdir()
    for name in BINARY_VERSIONS:
        (tmp_path / name).write_text("")
        (tmp_path / name).chmod(0o755)
        (tmp_path / ".stamps" / name).write_text(f"{name} v0.0.1 recipe=1")
    with pytest.raises(MissingBinariesError, match="kwok"):
        require_binaries(tmp_path)


def test_node_manifest_carries_capacity_labels_and_the_kwok_annotation() -> None:
    spec = NodeSpec("gpu-1", cpu="16", memory="64Gi", gpus=2, labels={"pool": "gpu"})
    manifest = spec.manifest()
    assert manifest["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert manifest["metadata"]["labels"]["pool"] == "gpu"
    assert manifest["status"]["allocatable"] == {
        "cpu": "16",
        "memory": "64Gi",
        "pods": "110",
        "nvidia.com/gpu": "2",
    }
    assert "nvidia.com/gpu" not in NodeSpec("cpu-1").manifest()["status"]["capacity"]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["cluster", "up", "--node-cpu", "lots"], "--node-cpu"),
        (["cluster", "up", "--nodes", "-1"], "--nodes"),
        (["cluster", "up", "--node-label", "novalue"], "--node-label"),
        (["cluster", "up", "--timeout", "0"], "--timeout"),
        (["cluster", "sideways"], "up|down|env|status"),
    ],
)
def test_cli_rejects_bad_arguments_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main(argv)
    assert raised.value.code == 2
    assert flag in capsys.readouterr().err


def test_env_without_a_running_cluster_fails_with_a_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cluster", "env", "--state-dir", str(tmp_path)]) == 1
    assert "tideshift dev cluster up" in capsys.readouterr().err


def test_up_refuses_a_foreign_non_empty_state_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    assert cli.main(["cluster", "up", "--state-dir", str(tmp_path)]) == 2
    assert "--state-dir" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").exists()


def _tideshift(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tideshift.services.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ.copy(),
    )


@pytest.mark.k8s
def test_dev_cluster_up_env_down_leaves_no_process_behind(
    k8s_bin_dir: Path, tmp_path: Path
) -> None:
    state_dir = tmp_path / "devcluster"
    common = ("--state-dir", str(state_dir))
    # the bare control plane: the engines' own up/status/down is tests/k8s/engines
    bare = ("--without", "kueue,training-operator,kuberay")

    up = _tideshift("dev", "cluster", "up", *common, *bare, "--nodes", "1", "--gpu-nodes", "0")
    assert up.returncode == 0, up.stderr + up.stdout
    records = state_processes(load_state(state_dir) or {})
    try:
        assert {record.name for record in records} == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        }
        # `up` has exited; the cluster keeps running on its own.
        assert all(pid_alive(record.pid) for record in records)
        again = _tideshift("dev", "cluster", "up", *common)
        assert again.returncode == 0 and "already running" in again.stdout

        env = _tideshift("dev", "cluster", "env", *common)
        assert env.returncode == 0, env.stderr
        kubeconfig = env.stdout.strip().removeprefix("export KUBECONFIG=")
        nodes = subprocess.run(
            [
                str(k8s_bin_dir / "kubectl"),
                f"--kubeconfig={kubeconfig}",
                "get",
                "nodes",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert nodes.stdout.split() == ["node/kwok-node-0"]
    finally:
        down = _tideshift("dev", "cluster", "down", *common)
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(record.pid) for record in records)
    assert not state_dir.exists()
