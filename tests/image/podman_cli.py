"""podman as the image tests run it: with the repository's containers.conf (runc, cgroupfs,
ulimits within this kind of machine's hard limits) unless CONTAINERS_CONF says otherwise."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The core image and the predictor's (the core image plus the `forecast` extra): `make image`.
IMAGE = os.environ.get("TIDESHIFT_IMAGE", "localhost/tideshift:dev")
PREDICTOR_IMAGE = os.environ.get("TIDESHIFT_PREDICTOR_IMAGE", "localhost/tideshift-predictor:dev")
# `podman run` options as the chart runs a container: read-only root, /tmp only, no capabilities.
RESTRICTED = ["--read-only", "--tmpfs", "/tmp:rw,size=256m,mode=1777", "--cap-drop", "ALL"]


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(REPO / "tests" / "image" / "containers.conf"))
    return subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, check=check, timeout=timeout
    )
