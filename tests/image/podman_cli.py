"""podman as the image tests run it: with the repository's containers.conf (runc, cgroupfs,
ulimits within this kind of machine's hard limits) unless CONTAINERS_CONF says otherwise."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("TIDESHIFT_IMAGE", "localhost/tideshift:dev")


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(REPO / "tests" / "image" / "containers.conf"))
    return subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, check=check, timeout=timeout
    )
