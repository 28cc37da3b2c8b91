"""The generated reference pages are current, and the check names a page that is not."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]
REFERENCE = REPO / "docs" / "reference"


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_reference", REPO / "docs" / "gen_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_pages_match_the_code(
    generator: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code = generator.main(["--check"])
    assert code == 0, capsys.readouterr().out


def test_pages_are_written_alike_twice_and_a_changed_one_is_stale(
    generator: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, pages = tmp_path / "first", tmp_path / "reference"
    assert generator.main(["--out", str(first)]) == 0
    assert generator.main(["--out", str(pages)]) == 0
    names = sorted(page.name for page in first.glob("*.md"))
    assert {"settings.md", "metrics.md", "events.md", "helm-values.md"} <= set(names)
    assert names == sorted(page.name for page in pages.glob("*.md"))
    for name in names:
        assert (first / name).read_text() == (pages / name).read_text(), name

    settings = pages / "settings.md"
    settings.write_text(settings.read_text().replace("TIDESHIFT_NATS_URL", "TIDESHIFT_NATS_URI"))
    (pages / "orphan.md").write_text("# written by nobody\n")
    capsys.readouterr()
    code = generator.main(["--check", "--out", str(pages)])

    out = capsys.readouterr().out
    assert code == 1
    assert "settings.md" in out
    assert "orphan.md" in out
    assert "commands.md" not in out
    assert "python docs/gen_reference.py" in out
