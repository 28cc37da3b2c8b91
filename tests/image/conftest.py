from __future__ import annotations

import shutil

import pytest

from tests.fixtures.requirements import missing_dependency
from tests.image.podman_cli import IMAGE, podman


@pytest.fixture(scope="session")
def image() -> str:
    """The image `make image` built (TIDESHIFT_IMAGE names another)."""
    if shutil.which("podman") is None:
        missing_dependency("podman not found: `make image-deps` installs it (Debian)")
    if podman("image", "exists", IMAGE, check=False).returncode != 0:
        missing_dependency(f"image {IMAGE} not built: run `make image`")
    return IMAGE
