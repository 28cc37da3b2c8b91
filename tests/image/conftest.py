from __future__ import annotations

import shutil

import pytest

from tests.fixtures.requirements import missing_dependency
from tests.image.podman_cli import IMAGE, PREDICTOR_IMAGE, podman


def built(image: str, variable: str) -> str:
    if shutil.which("podman") is None:
        missing_dependency("podman not found: `make image-deps` installs it (Debian)")
    if podman("image", "exists", image, check=False).returncode != 0:
        missing_dependency(f"image {image} not built: run `make image` ({variable} names another)")
    return image


@pytest.fixture(scope="session")
def image() -> str:
    """The core image `make image` built (TIDESHIFT_IMAGE names another)."""
    return built(IMAGE, "TIDESHIFT_IMAGE")


@pytest.fixture(scope="session")
def predictor_image() -> str:
    """The predictor's image `make image` built (TIDESHIFT_PREDICTOR_IMAGE names another)."""
    return built(PREDICTOR_IMAGE, "TIDESHIFT_PREDICTOR_IMAGE")
