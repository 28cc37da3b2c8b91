"""Load only goes to loopback addresses unless a host is explicitly allowed."""

from __future__ import annotations

import pytest

from tideshift.loadgen.cli import main
from tideshift.loadgen.driver import TargetRefused, check_target, in_cluster_names


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/",
        "http://127.8.9.10/",
        "http://localhost:1234/x",
        "http://[::1]:80/",
    ],
)
def test_loopback_targets_are_allowed(url: str) -> None:
    check_target(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5:8080/",
        "http://example.com/",
        "https://192.168.1.1/",
        "http://web.default.svc.cluster.local/",
        "http://0.0.0.0:8080/",
        "http://localhost.example.com/",
    ],
)
def test_other_targets_are_refused(url: str) -> None:
    with pytest.raises(TargetRefused, match="--allow-target"):
        check_target(url)


def test_bad_urls_are_refused() -> None:
    with pytest.raises(TargetRefused, match="http"):
        check_target("ftp://127.0.0.1/")
    with pytest.raises(TargetRefused, match="no host"):
        check_target("http:///path")


def test_explicitly_allowed_hosts_pass() -> None:
    assert check_target("http://Example.com/", allowed_hosts=["example.com"]) == "example.com"
    names = in_cluster_names("web.default")
    assert check_target("http://web.default.svc.cluster.local:80/", allowed_hosts=names)
    assert check_target("http://web.default:80/", allowed_hosts=names)
    with pytest.raises(TargetRefused):
        check_target("http://api.default.svc/", allowed_hosts=names)


def test_cli_refuses_a_remote_target_before_sending_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--target", "http://93.184.216.34/", "--duration", "1"])
    assert stopped.value.code == 2
    assert "refusing to send load to '93.184.216.34'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--duration", "0"], "--duration"),
        (["--duration", "1", "--speed", "-1"], "--speed"),
        (["--duration", "1", "--max-in-flight", "0"], "--max-in-flight"),
        (["--duration", "1", "--surge", "bad"], "--surge"),
        (["--duration", "1", "--trough-rps", "500"], "trough"),
    ],
)
def test_cli_validates_flags(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--target", "http://127.0.0.1:9/", *argv])
    assert stopped.value.code == 2
    assert flag in capsys.readouterr().err
