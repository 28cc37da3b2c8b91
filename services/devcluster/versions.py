"""Where the Go-built control-plane binaries live, and which versions they must be.

tests/cluster/build.sh is the source of these pins; a test checks the two agree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

K8S_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.7.0"
HELM_VERSION = "v3.22.0"

BINARY_VERSIONS: Mapping[str, str] = {
    "etcd": ETCD_VERSION,
    "kube-apiserver": K8S_VERSION,
    "kube-controller-manager": K8S_VERSION,
    "kube-scheduler": K8S_VERSION,
    "kubectl": K8S_VERSION,
    "kwok": KWOK_VERSION,
    "helm": HELM_VERSION,
}

BUILD_HINT = "run `bash tests/cluster/build.sh` (or `make k8s-binaries`)"


class MissingBinariesError(RuntimeError):
    """The control-plane binaries are absent or stale; the message says how to build them."""


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("TIDESHIFT_CACHE_DIR"):
        return Path(env["TIDESHIFT_CACHE_DIR"])
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path(env.get("HOME", str(Path.home()))) / ".cache"
    return base / "tideshift"


def default_bin_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Same rule as build.sh: TIDESHIFT_K8S_BIN_DIR, else <cache>/k8s-<version>/bin."""
    env = os.environ if environ is None else environ
    if env.get("TIDESHIFT_K8S_BIN_DIR"):
        return Path(env["TIDESHIFT_K8S_BIN_DIR"])
    return cache_root(env) / f"k8s-{K8S_VERSION}" / "bin"


def stale_binaries(bin_dir: Path) -> list[str]:
    """Names of binaries that are missing, not executable, or stamped with another version."""
    stale = []
    for name, version in BINARY_VERSIONS.items():
        binary = bin_dir / name
        stamp = bin_dir / ".stamps" / name
        try:
            stamped_version = stamp.read_text().split()[1]
        except (OSError, IndexError):
            stamped_version = ""
        if not (binary.is_file() and os.access(binary, os.X_OK)) or stamped_version != version:
            stale.append(name)
    return stale


def require_binaries(bin_dir: Path, names: list[str] | None = None) -> None:
    wanted = set(BINARY_VERSIONS if names is None else names)
    stale = [name for name in stale_binaries(bin_dir) if name in wanted]
    if stale:
        raise MissingBinariesError(
            f"Kubernetes {K8S_VERSION} binaries missing or stale in {bin_dir} "
            f"({', '.join(stale)}): {BUILD_HINT}"
        )
