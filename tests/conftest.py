"""Shared test plumbing: every module in tests/fixtures/ is a pytest plugin (one per server)."""

from pathlib import Path

pytest_plugins = sorted(
    f"tests.fixtures.{path.stem}"
    for path in (Path(__file__).parent / "fixtures").glob("*.py")
    if path.stem != "__init__"
)
