"""Newcomer errors stop `tideshift demo` before anything starts, with one line saying what to do."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tideshift.services.demo.cli import build_parser, main
from tideshift.services.demo.world import demo_world


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_port_taken(tmp_path: Path, taken_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path), "--nats-port", str(taken_port)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert f"--nats-port {taken_port} is already in use" in line
    assert "choose another port" in line


def test_unwritable_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A directory cannot be made under a regular file, even by root (CI runs as root).
    occupied = tmp_path / "file"
    occupied.write_text("x")
    assert main(["--out", str(occupied / "out")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "cannot write to --out" in line


def test_out_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    occupied = tmp_path / "file"
    occupied.write_text("x")
    assert main(["--out", str(occupied)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "cannot write to --out" in line and "--out ./demo-out" in line


def test_bad_trace_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp_s,requests\n0,5\n60,five\n")
    assert main(["--out", str(tmp_path / "out"), "--trace", str(trace)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "line 3" in line and "--trace" in line


def test_missing_kubeconfig_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--out", str(tmp_path / "out"), "--cluster", str(tmp_path / "nope.yaml")])
    assert code == 1
    assert "no such kubeconfig file" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["--hours", "0"], "--hours"), (["--speed", "-2"], "--speed"), (["--noise", "3"], "--noise")],
)
def test_flags_are_validated(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--out", str(tmp_path), *argv])
    assert stopped.value.code == 2
    assert flag in capsys.readouterr().err


def test_real_cluster_mode_without_binaries_says_how_to_build_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tideshift.services.demo import kubedemo

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no dev cluster state
    monkeypatch.setenv("TIDESHIFT_K8S_BIN_DIR", str(tmp_path / "no-binaries"))
    monkeypatch.setattr(kubedemo, "require_prometheus", lambda: "prometheus")
    assert main(["--out", str(tmp_path / "out"), "--cluster", "kubeconfig"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "make k8s-binaries" in line and "--cluster PATH" in line


def test_real_cluster_mode_without_prometheus_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["--out", str(tmp_path / "out"), "--cluster", "kubeconfig"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "apt-get install prometheus" in line


@pytest.mark.parametrize(("argv", "batch_jobs"), [([], ["ctr-lend"]), (["--no-lend"], [])])
def test_lending_is_on_unless_turned_off(argv: list[str], batch_jobs: list[str]) -> None:
    args = build_parser().parse_args(argv)
    world = demo_world(lend=args.lend)
    assert [job.name for job in world.jobs if job.batch] == batch_jobs
    assert [job.name for job in world.jobs if not job.batch] == ["ctr-a", "ctr-b", "ctr-c"]
