"""Shared test plumbing: every module in tests/fixtures/ is a pytest plugin (one per server),
except `requirements`, a helper the plugins import, and `support`, which tests import."""

from pathlib import Path

pytest_plugins = sorted(
    f"tests.fixtures.{path.stem}"
    for path in (Path(__file__).parent / "fixtures").glob("*.py")
    if path.stem not in {"__init__", "requirements", "support"}
)
