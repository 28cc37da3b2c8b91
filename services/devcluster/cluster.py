"""Start, describe and stop a real local control plane made of Go-built binaries.

etcd, kube-apiserver (client-certificate auth from a generated CA, ServiceAccount tokens,
Node+RBAC authorization, priority admission), kube-controller-manager, kube-scheduler and
kwok (fake nodes and kubelets) run as child processes on free loopback ports, each in its
own process group, with their files in one state directory; optionally also the engines
users run beside Tideshift (Kueue, the training operator, KubeRay: see engines.py).
Blocking on purpose: start-up is sequential and the callers (pytest fixtures, the CLI) are
synchronous.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.lifetime import die_with_parent
from tideshift.services.common.ports import free_ports
from tideshift.services.devcluster.crds import install_crds
from tideshift.services.devcluster.credentials import write_pki
from tideshift.services.devcluster.engine_manifests import EngineManifestError
from tideshift.services.devcluster.engines import (
    ENGINES,
    EngineContext,
    default_engines_dir,
    prepare_engines,
    require_engines,
)
from tideshift.services.devcluster.kwok_stages import write_kwok_config
from tideshift.services.devcluster.nodes import (
    KWOK_NODE_ANNOTATION,
    NodeSpec,
    node_schedulable,
)
from tideshift.services.devcluster.processes import (
    STATE_FILE,
    ProcessRecord,
    log_tail,
    terminate_processes,
    wait_for,
)
from tideshift.services.devcluster.scheduler_profile import write_scheduler_config
from tideshift.services.devcluster.storage import STORAGE_CLASS, install_storage
from tideshift.services.devcluster.versions import K8S_VERSION, require_binaries

__all__ = [
    "ADMIN_KUBECONFIG",
    "ClusterOptions",
    "ClusterStartError",
    "LocalCluster",
    "NodeSpec",
]

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Service IPs and kwok's fake pod IPs must not overlap.
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.1/16"
ADMIN_KUBECONFIG = "admin.kubeconfig"

Progress = Callable[[str], None]


class ClusterStartError(RuntimeError):
    """A component exited or did not become ready; the message carries its last log lines."""


@dataclass
class ClusterOptions:
    bin_dir: Path
    # None: a fresh temp dir, removed on stop. A given dir is kept (it holds the state file).
    state_dir: Path | None = None
    nodes: Sequence[NodeSpec] = ()
    # Children get SIGKILL when the starting thread dies (even by SIGKILL): right for tests,
    # wrong for `dev cluster up`, whose processes must outlive the command.
    die_with_parent: bool = True
    start_timeout: float = 90.0
    extra_apiserver_args: Sequence[str] = ()
    # The Volcano Job and PyTorchJob CRDs, so those kinds can be tried here.
    workload_crds: bool = True
    # A default StorageClass with volumes that bind (the chart's bundled NATS claims one).
    storage: bool = True
    # Engines to start (names from engines.ENGINE_NAMES); none by default.
    engines: Sequence[str] = ()
    # None: engines.default_engines_dir() (where tests/cluster/build_engines.sh puts them).
    engines_dir: Path | None = None
    # The engines start after the control plane, with a deadline of their own.
    engine_timeout: float = 180.0


class LocalCluster:
    """One control plane. Use as a context manager, or start()/stop()."""

    def __init__(self, options: ClusterOptions) -> None:
        self.options = options
        self._owns_state_dir = options.state_dir is None
        self.state_dir = options.state_dir or Path(tempfile.mkdtemp(prefix="tideshift-k8s-"))
        self._records: list[ProcessRecord] = []
        self._popens: dict[str, subprocess.Popen[bytes]] = {}
        self._ports: dict[str, int] = {}
        self._atexit_registered = False

    # ---- description -----------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        return self.options.bin_dir

    @property
    def engines_dir(self) -> Path:
        return self.options.engines_dir or default_engines_dir()

    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / ADMIN_KUBECONFIG

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self._ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self._ports['etcd']}"

    @property
    def ca_pem(self) -> bytes:
        return (self.pki_dir / "ca.crt").read_bytes()

    @property
    def processes(self) -> list[ProcessRecord]:
        return list(self._records)

    def api_client(self) -> Any:
        """A fresh admin `kubernetes.client.ApiClient` (callers close it)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig_path))  # type: ignore[no-untyped-call]

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, progress: Progress | None = None) -> None:
        say = progress or (lambda _message: None)
        require_binaries(self.bin_dir)
        if self.options.engines:
            require_engines(self.engines_dir, self.options.engines)
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._start(say)
        except BaseException:
            self.stop()
            raise

    def _start(self, say: Progress) -> None:
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        names = ["etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"]
        self._ports = dict(zip(names, free_ports(len(names)), strict=True))
        say(f"generating certificates in {self.pki_dir}")
        write_pki(self.pki_dir, server=self.server_url, admin_kubeconfig=self.kubeconfig_path)
        deadline = time.monotonic() + self.options.start_timeout

        say(f"starting etcd on {self.etcd_url}")
        self._launch("etcd", deadline)
        say(f"starting kube-apiserver {K8S_VERSION} on {self.server_url}")
        self._launch("kube-apiserver", deadline)
        say("starting kube-controller-manager, kube-scheduler and kwok")
        later = ["kube-controller-manager", "kube-scheduler", "kwok"]
        for name in later:
            self._spawn(name, self._arguments(name))
        for name in later:
            self._wait_component(name, deadline)
        self._save_state()

        if self.options.nodes:
            say(f"creating {len(self.options.nodes)} kwok nodes")
            self.create_nodes(self.options.nodes, timeout=max(5.0, deadline - time.monotonic()))
        if self.options.workload_crds or self.options.storage:
            with self.api_client() as api_client:
                if self.options.workload_crds:
                    say(self._structural_crds_message())
                    install_crds(api_client, timeout=max(5.0, deadline - time.monotonic()))
                if self.options.storage:
                    say(f"creating the default StorageClass {STORAGE_CLASS} and its volumes")
                    install_storage(api_client)
        if self.options.engines:
            self.start_engines(self.options.engines, progress=say)
        say(f"cluster ready: KUBECONFIG={self.kubeconfig_path}")

    def _structural_crds_message(self) -> str:
        if "training-operator" in self.options.engines:
            return (
                "installing the structural Volcano Job, PyTorchJob and KEDA ScaledObject CRDs "
                "(the training operator's own PyTorchJob CRD replaces the second)"
            )
        return "installing the Volcano Job, PyTorchJob and KEDA ScaledObject CRDs"

    def start_engines(self, names: Sequence[str], progress: Progress | None = None) -> None:
        """Installs the engines' CRDs and webhooks, starts them and waits until each is ready."""
        say = progress or (lambda _message: None)
        context = EngineContext(
            engines_dir=self.engines_dir,
            state_dir=self.state_dir,
            pki_dir=self.pki_dir,
            server=self.server_url,
            pytorchjob_kind=self.options.workload_crds,
        )
        timeout = self.options.engine_timeout
        say(f"installing the CRDs and webhooks of {', '.join(names)}")
        try:
            with self.api_client() as api_client:
                launches = prepare_engines(KubeHttp(api_client), names, context, timeout=timeout)
        except EngineManifestError as error:
            raise ClusterStartError(f"engine manifests: {error}") from error
        say(f"starting {', '.join(names)}")
        for launch in launches:
            self._ports.update(launch.ports)
            self._spawn(launch.name, launch.args, binary=launch.binary, env=launch.env)
        self._save_state()
        deadline = time.monotonic() + timeout
        for launch in launches:
            self._wait_ready(launch.name, launch.ready_url, deadline, tls=None)

    def restart(self, name: str, *, crash: bool = True, timeout: float = 120.0) -> None:
        """Stops one component (SIGKILL by default, like a crash) and starts it again on the
        same port with the same data, then waits until it is ready again."""
        record = next(record for record in self._records if record.name == name)
        if crash:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)
        terminate_processes([record], self._popens, grace=10.0)
        self._records.remove(record)
        self._popens.pop(name, None)
        self._launch(name, time.monotonic() + timeout)
        self._save_state()

    def _launch(self, name: str, deadline: float) -> None:
        self._spawn(name, self._arguments(name))
        self._wait_component(name, deadline)

    def _arguments(self, name: str) -> list[str]:
        builders = {
            "etcd": self._etcd_args,
            "kube-apiserver": self._apiserver_args,
            "kube-controller-manager": self._controller_manager_args,
            "kube-scheduler": self._scheduler_args,
            "kwok": self._kwok_args,
        }
        return builders[name]()

    def _wait_component(self, name: str, deadline: float) -> None:
        port = self._ports
        probes: dict[str, tuple[str, str | None]] = {
            "etcd": (f"{self.etcd_url}/health", None),
            "kube-apiserver": (f"{self.server_url}/readyz", "admin"),
            # Self-signed serving certificates, loopback only. The controller-manager serves
            # /healthz but no /readyz (404 in v1.36).
            "kube-controller-manager": (
                f"https://127.0.0.1:{port['controller-manager']}/healthz",
                "insecure",
            ),
            "kube-scheduler": (f"https://127.0.0.1:{port['scheduler']}/readyz", "insecure"),
            "kwok": (f"http://127.0.0.1:{port['kwok']}/healthz", None),
        }
        url, tls = probes[name]
        self._wait_ready(name, url, deadline, tls=tls)

    def stop(self, grace: float = 10.0) -> None:
        """Stops every component (TERM, then KILL after `grace`); safe to call twice."""
        terminate_processes(self._records, self._popens, grace=grace)
        self._records.clear()
        self._popens.clear()
        if self._owns_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    # ---- state for `dev cluster` -----------------------------------------------------------

    def _save_state(self) -> None:
        state = {
            "k8s_version": K8S_VERSION,
            "bin_dir": str(self.bin_dir),
            "server": self.server_url,
            "kubeconfig": str(self.kubeconfig_path),
            "ports": self._ports,
            "processes": [asdict(record) for record in self._records],
            "engines": {
                record.name: ENGINES[record.name].version
                for record in self._records
                if record.name in ENGINES
            },
        }
        tmp = self.state_dir / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_dir / STATE_FILE)

    def detach(self) -> None:
        """Leaves the processes running after this Python process exits (`dev cluster up`)."""
        self._owns_state_dir = False
        self._popens.clear()
        self._records.clear()
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    # ---- nodes -----------------------------------------------------------------------------

    def create_nodes(self, specs: Sequence[NodeSpec], *, timeout: float = 60.0) -> None:
        """Creates kwok nodes and waits until each is Ready and free of the not-ready taint."""
        from kubernetes import client

        with self.api_client() as api_client:
            # Any: the client's stubs want V1Node, but it sends plain manifests unchanged.
            core: Any = client.CoreV1Api(api_client)
            for spec in specs:
                core.create_node(body=spec.manifest())
            wait_for(
                lambda: all(node_schedulable(core.read_node(spec.name)) for spec in specs),
                timeout=timeout,
                what=f"nodes {[spec.name for spec in specs]} to become Ready",
            )

    def delete_nodes(self, names: Sequence[str]) -> None:
        from kubernetes import client

        with self.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            for name in names:
                with contextlib.suppress(client.ApiException):
                    core.delete_node(name)

    # ---- components --------------------------------------------------------------------------

    def _etcd_args(self) -> list[str]:
        client_url = self.etcd_url
        peer_url = f"http://127.0.0.1:{self._ports['etcd-peer']}"
        return [
            "--name=tideshift",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=tideshift={peer_url}",
            "--initial-cluster-state=new",
            # A disposable cluster: durability buys nothing, fsync latency costs start-up time.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]

    def _apiserver_args(self) -> list[str]:
        pki_dir = self.pki_dir
        return [
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self._ports['apiserver']}",
            f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
            f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
            f"--client-ca-file={pki_dir / 'ca.crt'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # Added to the default plugin set (which already has Priority and ServiceAccount).
            "--enable-admission-plugins=NodeRestriction,Priority",
            "--allow-privileged=true",
            "--profiling=false",
            f"--cert-dir={self.state_dir / 'apiserver'}",
            *self.options.extra_apiserver_args,
        ]

    def _component_common_args(self, stem: str, port_name: str) -> list[str]:
        kubeconfig = self.pki_dir / f"{stem}.kubeconfig"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self._ports[port_name]}",
            f"--cert-dir={self.state_dir / stem}",
            # One instance: no lease to wait for after a restart.
            "--leader-elect=false",
        ]

    def _controller_manager_args(self) -> list[str]:
        pki_dir = self.pki_dir
        return [
            *self._component_common_args("controller-manager", "controller-manager"),
            f"--service-account-private-key-file={pki_dir / 'sa.key'}",
            f"--root-ca-file={pki_dir / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki_dir / 'ca.crt'}",
            f"--cluster-signing-key-file={pki_dir / 'ca.key'}",
            "--use-service-account-credentials=true",
            # kwok's heartbeats can lag on a loaded two-core machine; a node briefly marked
            # NotReady gets its pods marked unready, and kwok never marks them ready again.
            "--node-monitor-grace-period=3m",
            "--node-startup-grace-period=3m",
            # HPAs are synced every 5 s instead of 15 s: the other-autoscalers tests wait on
            # the real HPA controller, and a development cluster's few HPAs cost nothing.
            "--horizontal-pod-autoscaler-sync-period=5s",
        ]

    def _scheduler_args(self) -> list[str]:
        config = write_scheduler_config(
            self.state_dir / "scheduler" / "config.yaml", self.pki_dir / "scheduler.kubeconfig"
        )
        return [*self._component_common_args("scheduler", "scheduler"), f"--config={config}"]

    def _kwok_args(self) -> list[str]:
        stages = write_kwok_config(self.state_dir / "kwok" / "config.yaml")
        return [
            f"--kubeconfig={self.pki_dir / 'kwok.kubeconfig'}",
            f"--config={stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            f"--server-address=127.0.0.1:{self._ports['kwok']}",
            # Heartbeat through node Leases, as kubelets do, not only node status patches.
            "--node-lease-duration-seconds=40",
        ]

    def _spawn(
        self,
        name: str,
        args: list[str],
        *,
        binary: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        binary = binary or self.bin_dir / name
        log_path = self.state_dir / "logs" / f"{name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [str(binary), *args],
                env={**os.environ, **env} if env else None,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                start_new_session=True,
                preexec_fn=(  # noqa: PLW1509  # only prctl and getppid run before exec
                    die_with_parent(os.getpid()) if self.options.die_with_parent else None
                ),
            )
        self._popens[name] = process
        self._records.append(ProcessRecord(name, process.pid, str(binary), str(log_path)))

    def _wait_ready(self, name: str, url: str, deadline: float, *, tls: str | None) -> None:
        context: ssl.SSLContext | None = None
        if tls == "admin":
            context = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
            context.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        elif tls == "insecure":
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        process = self._popens[name]
        last_error = ""
        while True:
            if process.poll() is not None:
                raise ClusterStartError(
                    f"{name} exited with code {process.returncode} during start-up; "
                    f"last lines of {self.state_dir / 'logs' / (name + '.log')}:\n"
                    f"{log_tail(self.state_dir / 'logs' / f'{name}.log')}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as response:
                    if response.status == 200:
                        return
                    last_error = f"HTTP {response.status}"
            except urllib.error.HTTPError as error:
                last_error = f"HTTP {error.code}: {error.read()[-300:].decode(errors='replace')}"
            except (OSError, ssl.SSLError) as error:
                last_error = str(error)
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"{name} not ready at {url} before its deadline "
                    f"(last answer: {last_error}); last log lines:\n"
                    f"{log_tail(self.state_dir / 'logs' / f'{name}.log')}"
                )
            time.sleep(0.1)
