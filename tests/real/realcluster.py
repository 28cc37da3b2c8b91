"""The real-cluster tier's session fixture: real nodes (kubelet, containerd, runc, kube-proxy,
CoreDNS) inside network namespaces the run creates, set up once per session by
tests/cluster/real/cluster.sh.

The session's teardown takes the cluster down and checks that the host's addresses, routes and
iptables/nftables rules are exactly what they were before it came up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.requirements import REPOSITORY, missing_dependency

CLUSTER_SH = REPOSITORY / "tests" / "cluster" / "real" / "cluster.sh"
# A prefix of its own, so the suite never takes down a cluster someone brought up by hand.
PREFIX = os.environ.get("TIDESHIFT_REAL_TEST_PREFIX", "tsrt")
# Three: the compressed day keeps Tideshift on node 0 and loses a worker node.
NODES = int(os.environ.get("TIDESHIFT_REAL_NODES", "3"))
IMAGE = os.environ.get("TIDESHIFT_IMAGE", "localhost/tideshift:dev")
PREDICTOR_IMAGE = os.environ.get("TIDESHIFT_PREDICTOR_IMAGE", "localhost/tideshift-predictor:dev")
UP_TIMEOUT_S = 1800.0  # a cold run also builds the kubelet, kube-proxy and CoreDNS
DOWN_TIMEOUT_S = 120.0


def host_network_state() -> dict[str, str]:
    """What must be identical before and after the cluster: the host's network configuration."""

    def run(*argv: str) -> str:
        if shutil.which(argv[0]) is None:
            return f"({argv[0]} not installed)"
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
        # iptables-save's comment lines carry a timestamp; counters are not configuration.
        lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
        return "\n".join(lines) + (f"\n(exit {done.returncode})" if done.returncode else "")

    return {
        "links": run("ip", "-o", "link", "show"),
        "addresses": run("ip", "-o", "address", "show"),
        "routes": run("ip", "route", "show", "table", "all"),
        "routes6": run("ip", "-6", "route", "show", "table", "all"),
        "rules": run("ip", "rule", "show"),
        "iptables": run("iptables-save"),
        "ip6tables": run("ip6tables-save"),
        "nftables": run("nft", "list", "ruleset"),
        "netns": "\n".join(
            name for name in run("ip", "netns", "list").splitlines() if name.startswith(PREFIX)
        ),
    }


@dataclass
class RealCluster:
    kubeconfig: Path
    kubectl_bin: Path
    nodes: int
    env: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)

    def kubectl(
        self, *args: str, stdin: str | None = None, timeout: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [
                str(self.kubectl_bin),
                f"--kubeconfig={self.kubeconfig}",
                # in the state dir (down removes it), not ~/.kube/cache
                f"--cache-dir={self.kubeconfig.parent / 'kube-cache'}",
                *args,
            ],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)


def _script(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def _check_prerequisites() -> None:
    if os.geteuid() != 0:
        missing_dependency("the real cluster needs root (network namespaces, containerd, kubelet)")
    if shutil.which("podman") is None:
        missing_dependency("podman not found: `make image-deps` installs it (Debian)")
    for image in (IMAGE, PREDICTOR_IMAGE):
        exists = subprocess.run(["podman", "image", "exists", image], check=False, timeout=60)
        if exists.returncode != 0:
            missing_dependency(f"image {image} not built: run `make image`")


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    """A real cluster of NODES nodes, up for the session; the host is checked afterwards."""
    _check_prerequisites()
    env = {
        **os.environ,
        "TIDESHIFT_REAL_PREFIX": PREFIX,
        "TIDESHIFT_REAL_IMAGES": f"{IMAGE} {PREDICTOR_IMAGE}",
    }
    # A previous session killed half-way leaves its namespaces: down is idempotent.
    _script(env, "down", timeout=DOWN_TIMEOUT_S)
    before = host_network_state()
    started = time.monotonic()
    try:
        up = _script(env, "up", "--nodes", str(NODES), timeout=UP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _script(env, "down", timeout=DOWN_TIMEOUT_S)
        pytest.fail(f"cluster.sh up took more than {UP_TIMEOUT_S:.0f} s")
    up_s = time.monotonic() - started
    if up.returncode != 0:
        _script(env, "down", timeout=DOWN_TIMEOUT_S)
        pytest.fail(f"cluster.sh up failed:\n{up.stdout[-4000:]}\n{up.stderr[-8000:]}")
    kubeconfig = Path(_script(env, "kubeconfig", timeout=30).stdout.strip())
    bin_dir = subprocess.run(
        ["bash", str(REPOSITORY / "tests" / "cluster" / "build.sh"), "--print-bin-dir"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    cluster = RealCluster(kubeconfig, Path(bin_dir) / "kubectl", NODES, env, {"up_s": up_s})
    try:
        yield cluster
    finally:
        started = time.monotonic()
        down = _script(env, "down", timeout=DOWN_TIMEOUT_S)
        cluster.timings["down_s"] = time.monotonic() - started
        print(f"\nreal cluster timings: {cluster.timings}")
        assert down.returncode == 0, f"cluster.sh down failed:\n{down.stdout}\n{down.stderr}"
        after = host_network_state()
        changed = {key: (before[key], after[key]) for key in before if before[key] != after[key]}
        assert not changed, f"the host's network changed: {changed}"
        assert not kubeconfig.parent.exists(), f"down left its state dir {kubeconfig.parent}"
        cgroups = sorted(Path("/sys/fs/cgroup").glob(f"*/{PREFIX}-n*"))
        assert not cgroups, f"down left cgroups: {cgroups}"
