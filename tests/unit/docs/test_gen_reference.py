"""The generated reference pages are current, and the check names a page that is not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GENERATOR = REPO / "docs" / "gen_reference.py"
REFERENCE = REPO / "docs" / "reference"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATOR), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_reference_pages_match_the_code() -> None:
    result = _run("--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_changed_page_is_reported_stale(tmp_path: Path) -> None:
    pages = tmp_path / "reference"
    shutil.copytree(REFERENCE, pages)
    settings = pages / "settings.md"
    settings.write_text(settings.read_text().replace("TIDESHIFT_NATS_URL", "TIDESHIFT_NATS_URI"))
    (pages / "orphan.md").write_text("# written by nobody\n")

    result = _run("--check", "--out", str(pages))

    assert result.returncode == 1
    assert "settings.md" in result.stdout
    assert "orphan.md" in result.stdout
    assert "commands.md" not in result.stdout
    assert "python docs/gen_reference.py" in result.stdout


def test_writing_makes_the_check_pass(tmp_path: Path) -> None:
    pages = tmp_path / "reference"

    assert _run("--out", str(pages)).returncode == 0
    assert {page.name for page in pages.glob("*.md")} >= {"settings.md", "metrics.md"}
    assert _run("--check", "--out", str(pages)).returncode == 0
