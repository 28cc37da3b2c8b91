"""Start, describe and stop a real local control plane made of Go-built binaries.

etcd, kube-apiserver (client-certificate auth from a generated CA, ServiceAccount tokens,
Node+RBAC authorization, priority admission), kube-controller-manager, kube-scheduler and
kwok (fake nodes and kubelets) run as child processes on free loopback ports, each in its
own process group, with their files in one state directory. Blocking on purpose: start-up is
sequential and the callers (pytest fixtures, the CLI) are synchronous.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tideshift.services.common.lifetime import die_with_parent
from tideshift.services.devcluster import pki
from tideshift.services.devcluster.crds import install_crds
from tideshift.services.devcluster.kwok_stages import write_kwok_config
from tideshift.services.devcluster.scheduler_profile import (
    GPU_NODE_LABEL,
    write_scheduler_config,
)
from tideshift.services.devcluster.storage import STORAGE_CLASS, install_storage
from tideshift.services.devcluster.versions import K8S_VERSION, require_binaries

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_LABEL = "type"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Service IPs and kwok's fake pod IPs must not overlap.
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.1/16"
STATE_FILE = "state.json"
ADMIN_KUBECONFIG = "admin.kubeconfig"

Progress = Callable[[str], None]


class ClusterStartError(RuntimeError):
    """A component exited or did not become ready; the message carries its last log lines."""


@dataclass(frozen=True)
class NodeSpec:
    """A kwok-managed fake node. Quantities use Kubernetes notation ("8", "32Gi")."""

    name: str
    cpu: str = "8"
    memory: str = "32Gi"
    gpus: int = 0
    max_pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)
    # Each taint is {"key": ..., "value": ..., "effect": "NoSchedule" | "NoExecute" | ...}.
    taints: Sequence[Mapping[str, str]] = ()

    def manifest(self) -> dict[str, Any]:
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.max_pods)}
        if self.gpus:
            capacity["nvidia.com/gpu"] = str(self.gpus)
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            KWOK_NODE_LABEL: "kwok",
            **self.labels,
        }
        # Node status may be set on create (unlike most kinds); kwok's node-initialize stage
        # keeps capacity and fills in conditions, addresses and nodeInfo.
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": labels,
                "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            },
            "spec": {"taints": [dict(taint) for taint in self.taints]},
            "status": {
                "capacity": capacity,
                "allocatable": dict(capacity),
            },
        }


def default_nodes(
    count: int,
    *,
    cpu: str = "8",
    memory: str = "32Gi",
    gpu_nodes: int = 0,
    gpus_per_node: int = 4,
    labels: Mapping[str, str] | None = None,
) -> list[NodeSpec]:
    """`count` CPU nodes kwok-node-<i>, then `gpu_nodes` GPU nodes kwok-gpu-node-<i>."""
    extra = dict(labels or {})
    nodes = [NodeSpec(f"kwok-node-{i}", cpu=cpu, memory=memory, labels=extra) for i in range(count)]
    # GPU_NODE_LABEL as GPU feature discovery sets it: the packing profile keys on it
    gpu_labels = {**extra, "tideshift.io/accelerator": "nvidia", GPU_NODE_LABEL: "true"}
    nodes += [
        NodeSpec(
            f"kwok-gpu-node-{i}", cpu=cpu, memory=memory, gpus=gpus_per_node, labels=gpu_labels
        )
        for i in range(gpu_nodes)
    ]
    return nodes


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    binary: str
    log: str


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


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # Field 3, after the parenthesised command name, is the state; zombies are dead.
    return stat.rsplit(")", 1)[1].split()[0] not in {"Z", "X"}


def record_alive(record: ProcessRecord) -> bool:
    """The recorded process still runs (and its pid was not recycled by another program)."""
    return pid_alive(record.pid) and runs_binary(record.pid, record.binary)


def runs_binary(pid: int, binary: str) -> bool:
    """Guards against signalling a recycled pid that now belongs to something else."""
    try:
        return os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(binary)
    except OSError:
        return False


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_pem: bytes,
    user: str,
    client_cert_pem: bytes | None = None,
    client_key_pem: bytes | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> Path:
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    credentials: dict[str, str] = {}
    if client_cert_pem is not None and client_key_pem is not None:
        credentials["client-certificate-data"] = b64(client_cert_pem)
        credentials["client-key-data"] = b64(client_key_pem)
    if token is not None:
        credentials["token"] = token
    context: dict[str, str] = {"cluster": "tideshift-dev", "user": user}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tideshift-dev",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "tideshift-dev", "context": context}],
        "current-context": "tideshift-dev",
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


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
        self._ports = dict(zip(names, _free_ports(len(names)), strict=True))
        say(f"generating certificates in {self.pki_dir}")
        self._write_pki()
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
                    say("installing the Volcano Job and PyTorchJob CRDs")
                    install_crds(api_client, timeout=max(5.0, deadline - time.monotonic()))
                if self.options.storage:
                    say(f"creating the default StorageClass {STORAGE_CLASS} and its volumes")
                    install_storage(api_client)
        say(f"cluster ready: KUBECONFIG={self.kubeconfig_path}")

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
                lambda: all(_node_schedulable(core.read_node(spec.name)) for spec in specs),
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

    def _write_pki(self) -> None:
        self.pki_dir.mkdir(parents=True, exist_ok=True)
        ca = pki.CertificateAuthority()
        ca.pair.write(self.pki_dir, "ca")
        ca.issue_server(
            "kube-apiserver",
            dns_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ips=["127.0.0.1", "10.96.0.1"],
        ).write(self.pki_dir, "apiserver")
        private_pem, public_pem = pki.service_account_signing_key()
        (self.pki_dir / "sa.key").touch(mode=0o600)
        (self.pki_dir / "sa.key").write_bytes(private_pem)
        (self.pki_dir / "sa.pub").write_bytes(public_pem)
        ca_pem = ca.pair.cert_pem
        server = f"https://127.0.0.1:{self._ports['apiserver']}"
        identities = {
            # system:masters bypasses RBAC: the admin and kwok, which plays every kubelet.
            "admin": ("tideshift-admin", ("system:masters",)),
            "kwok": ("kwok-controller", ("system:masters",)),
            # The bootstrap RBAC policy grants these exact user names their roles.
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
        }
        for stem, (user, groups) in identities.items():
            pair = ca.issue_client(user, groups)
            pair.write(self.pki_dir, stem)
            path = (
                self.state_dir / ADMIN_KUBECONFIG
                if stem == "admin"
                else self.pki_dir / f"{stem}.kubeconfig"
            )
            write_kubeconfig(
                path,
                server=server,
                ca_pem=ca_pem,
                user=user,
                client_cert_pem=pair.cert_pem,
                client_key_pem=pair.key_pem,
            )

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

    def _spawn(self, name: str, args: list[str]) -> None:
        binary = self.bin_dir / name
        log_path = self.state_dir / "logs" / f"{name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [str(binary), *args],
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
                    f"{_log_tail(self.state_dir / 'logs' / f'{name}.log')}"
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
                    f"{name} not ready at {url} within {self.options.start_timeout:.0f}s "
                    f"(last answer: {last_error}); last log lines:\n"
                    f"{_log_tail(self.state_dir / 'logs' / f'{name}.log')}"
                )
            time.sleep(0.1)


def _node_schedulable(node: Any) -> bool:
    ready = any(
        condition.type == "Ready" and condition.status == "True"
        for condition in (node.status.conditions or [])
    )
    not_ready_taint = any(
        taint.key.startswith("node.kubernetes.io/") for taint in (node.spec.taints or [])
    )
    return ready and not not_ready_taint


def wait_for(
    predicate: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.2
) -> None:
    """Polls `predicate` until true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def terminate_processes(
    records: Sequence[ProcessRecord],
    popens: Mapping[str, subprocess.Popen[bytes]] | None = None,
    *,
    grace: float = 10.0,
) -> list[str]:
    """TERM every process group, KILL what is left after `grace`; returns the names stopped."""
    popens = popens or {}

    def alive(record: ProcessRecord) -> bool:
        process = popens.get(record.name)
        if process is not None:
            return process.poll() is None
        return pid_alive(record.pid)

    targets = [
        record
        for record in reversed(records)
        if alive(record) and (record.name in popens or runs_binary(record.pid, record.binary))
    ]
    for record in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(record) for record in targets) and time.monotonic() < deadline:
        time.sleep(0.05)
    for record in targets:
        # The whole group, in case a component left children behind.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGKILL)
    kill_deadline = time.monotonic() + 5.0
    while any(alive(record) for record in targets) and time.monotonic() < kill_deadline:
        time.sleep(0.05)
    return [record.name for record in targets]


def load_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state


def state_processes(state: Mapping[str, Any]) -> list[ProcessRecord]:
    return [ProcessRecord(**record) for record in state.get("processes", [])]


def service_account_kubeconfig(
    api_client: Any,
    *,
    server: str,
    ca_pem: bytes,
    namespace: str,
    service_account: str,
    path: Path,
    expiration_seconds: int = 3600,
) -> Path:
    """A kubeconfig that acts as namespace/service_account, with a TokenRequest token.

    This is how the services authenticate in a cluster, so RBAC can be tested as they will run.
    """
    from kubernetes import client

    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
    )
    answer: Any = client.CoreV1Api(api_client).create_namespaced_service_account_token(
        service_account, namespace, body=request
    )
    return write_kubeconfig(
        path,
        server=server,
        ca_pem=ca_pem,
        user=f"system:serviceaccount:{namespace}:{service_account}",
        token=answer.status.token,
        namespace=namespace,
    )
