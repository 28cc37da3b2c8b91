"""The engines users run beside Tideshift, as child processes of the local control plane:
Kueue's manager, the Kubeflow training operator and the KubeRay operator.

tests/cluster/build_engines.sh builds them from their Go modules and copies their CRDs and
webhook manifests into the cache; this module checks those files, installs the real CRDs
(the training operator's PyTorchJob CRD replaces the structural one of crds.py), and prepares
each engine's launch: a client identity (system:masters, like kwok; given as $KUBECONFIG),
loopback ports from services/common/ports.py, leader election off, and, where the engine has
webhooks, a serving certificate from a CA of its own with the Mutating/Validating
WebhookConfigurations pointed at `https://127.0.0.1:PORT`. Volcano is not served by this
machine's module proxy, so its Job keeps the structural CRD and kwok plays its pods.

Webhooks per engine:
- Kueue: its own internal certificate management stays on (its cert rotator wants a Secret
  and the webhook configurations it injects a CA into); the Secret is pre-filled with a CA
  and a certificate valid for both its Service name and 127.0.0.1, so the rotator keeps them.
- Training operator: same rotator, same approach. Its cert directory is fixed to
  /tmp/k8s-webhook-server/serving-certs (the rotator only checks a file exists there), while
  the webhook server reads $TMPDIR/k8s-webhook-server/serving-certs, so each cluster gets its
  own TMPDIR. Its webhook server listens on every interface (no flag for the host).
- KubeRay: its webhooks are optional (ENABLE_WEBHOOKS=true) and stay off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.ports import free_ports
from tideshift.services.devcluster import engine_manifests as manifests
from tideshift.services.devcluster import pki
from tideshift.services.devcluster.credentials import write_kubeconfig
from tideshift.services.devcluster.versions import cache_root

KUEUE_VERSION = "v0.17.0"
TRAINING_OPERATOR_VERSION = "v1.8.1"
KUBERAY_VERSION = "v1.5.0"

ENGINES_BUILD_HINT = "run `bash tests/cluster/build_engines.sh` (or `make k8s-binaries`)"


@dataclass(frozen=True)
class Engine:
    name: str
    binary: str
    version: str
    title: str


ENGINES: Mapping[str, Engine] = {
    engine.name: engine
    for engine in (
        Engine("kueue", "kueue", KUEUE_VERSION, "Kueue"),
        Engine("training-operator", "training-operator", TRAINING_OPERATOR_VERSION,
               "Kubeflow training operator"),
        Engine("kuberay", "kuberay-operator", KUBERAY_VERSION, "KubeRay operator"),
    )
}  # fmt: skip
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)

KUEUE_NAMESPACE = "kueue-system"
TRAINING_OPERATOR_NAMESPACE = "kubeflow"
# The kinds Kueue manages here, with the suffix of their webhook paths.
KUEUE_JOB_FRAMEWORK = "batch/job"
KUEUE_PYTORCHJOB_FRAMEWORK = "kubeflow.org/pytorchjob"
KUEUE_RAY_FRAMEWORKS = ("ray.io/raycluster", "ray.io/rayjob")
_FRAMEWORK_WEBHOOK_SUFFIX = {
    KUEUE_JOB_FRAMEWORK: "-batch-v1-job",
    KUEUE_PYTORCHJOB_FRAMEWORK: "-kubeflow-org-v1-pytorchjob",
    "ray.io/raycluster": "-ray-io-v1-raycluster",
    "ray.io/rayjob": "-ray-io-v1-rayjob",
}
# The Kueue CRDs whose versions convert through its /convert endpoint (its rotator injects
# the CA into exactly these, so they must carry a conversion webhook).
_KUEUE_CONVERTED_CRDS = (
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "multikueueclusters.kueue.x-k8s.io",
)
PYTORCHJOB_CRD = "pytorchjobs.kubeflow.org"
# The training operator's cert rotator checks this fixed path for a file, nothing more.
TRAINING_OPERATOR_CERT_CHECK = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")


class MissingEnginesError(RuntimeError):
    """An engine's binary or manifests are absent or stale; the message says how to build."""


def default_engines_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Same rule as build_engines.sh: TIDESHIFT_ENGINES_DIR, else <cache>/engines."""
    env = os.environ if environ is None else environ
    if env.get("TIDESHIFT_ENGINES_DIR"):
        return Path(env["TIDESHIFT_ENGINES_DIR"])
    return cache_root(env) / "engines"


def _stamped(stamp: Path, version: str) -> bool:
    try:
        return stamp.read_text().split()[1] == version
    except (OSError, IndexError):
        return False


def stale_engine_files(engines_dir: Path, names: Sequence[str]) -> list[str]:
    """What is missing for `names`, e.g. "kueue binary bin/kueue", "kuberay CRDs"."""
    stale = []
    for name in names:
        engine = ENGINES[name]
        binary = engines_dir / "bin" / engine.binary
        if not (binary.is_file() and os.access(binary, os.X_OK)) or not _stamped(
            engines_dir / "bin" / ".stamps" / engine.binary, engine.version
        ):
            stale.append(f"{name} {engine.version} binary bin/{engine.binary}")
        crds = engines_dir / "manifests" / name / "crds"
        if not any(crds.glob("*.yaml")) or not _stamped(
            engines_dir / "manifests" / ".stamps" / name, engine.version
        ):
            stale.append(f"{name} {engine.version} CRDs manifests/{name}/crds")
    return stale


def require_engines(engines_dir: Path, names: Sequence[str]) -> None:
    stale = stale_engine_files(engines_dir, names)
    if stale:
        raise MissingEnginesError(
            f"engine files missing or stale in {engines_dir} ({'; '.join(stale)}): "
            f"{ENGINES_BUILD_HINT}, or leave them out with "
            f"`--without {','.join(names)}`"
        )


def parse_engine_list(text: str) -> list[str]:
    """`kueue,kuberay` -> ["kueue", "kuberay"]; ValueError naming the known engines."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engine {', '.join(unknown)}; known: {', '.join(ENGINE_NAMES)}")
    return names


@dataclass
class EngineLaunch:
    """How to start one engine and how to know it is ready."""

    name: str
    binary: Path
    args: list[str]
    ready_url: str
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineContext:
    """What the engines need from the cluster that starts them."""

    engines_dir: Path
    state_dir: Path
    pki_dir: Path
    server: str
    # The PyTorchJob kind exists (the structural CRD) even without the training operator.
    pytorchjob_kind: bool = False


def prepare_engines(
    http: KubeHttp, names: Sequence[str], context: EngineContext, *, timeout: float
) -> list[EngineLaunch]:
    """Installs the engines' CRDs and webhook configurations and writes their certificates and
    configuration; returns how to launch each, in `names` order. Nothing is started here."""
    require_engines(context.engines_dir, names)
    selected = set(names)
    crd_names: list[str] = []
    for name in ("training-operator", "kuberay"):
        if name in selected:
            crd_names += _install_plain_crds(http, name, context)
    launches: dict[str, EngineLaunch] = {}
    if "kuberay" in selected:
        launches["kuberay"] = _kuberay_launch(context)
    if "training-operator" in selected:
        launches["training-operator"] = _training_operator_launch(http, context)
    if "kueue" in selected:
        frameworks = [KUEUE_JOB_FRAMEWORK]
        if "training-operator" in selected or context.pytorchjob_kind:
            frameworks.append(KUEUE_PYTORCHJOB_FRAMEWORK)
        if "kuberay" in selected:
            frameworks += KUEUE_RAY_FRAMEWORKS
        launch, kueue_crds = _kueue_launch(http, context, frameworks)
        launches["kueue"] = launch
        crd_names += kueue_crds
    manifests.wait_established(http, crd_names, timeout=timeout)
    return [launches[name] for name in names]


def _install_plain_crds(http: KubeHttp, name: str, context: EngineContext) -> list[str]:
    directory = context.engines_dir / "manifests" / name / "crds"
    # Only the PyTorchJob of the training operator's kinds: the operator runs that scheme only.
    only = [PYTORCHJOB_CRD] if name == "training-operator" else None
    crds = manifests.load_crds(directory, only=only)
    for crd in crds:
        manifests.apply(http, manifests.CRD_PATH, crd)
    return [crd["metadata"]["name"] for crd in crds]


def _engine_dir(context: EngineContext, name: str) -> Path:
    directory = context.state_dir / name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _identity_kubeconfig(context: EngineContext, name: str) -> Path:
    """A client certificate in system:masters, signed by the cluster CA."""
    ca = pki.CertificateAuthority.load(
        (context.pki_dir / "ca.crt").read_bytes(), (context.pki_dir / "ca.key").read_bytes()
    )
    user = f"tideshift-engine-{name}"
    pair = ca.issue_client(user, ("system:masters",))
    return write_kubeconfig(
        context.pki_dir / f"{name}.kubeconfig",
        server=context.server,
        ca_pem=ca.pair.cert_pem,
        user=user,
        client_cert_pem=pair.cert_pem,
        client_key_pem=pair.key_pem,
    )


@dataclass(frozen=True)
class _WebhookCerts:
    ca_pem: bytes
    secret: dict[str, bytes]


def _webhook_certs(
    http: KubeHttp, *, ca_name: str, service: str, namespace: str, secret: str, cert_dir: Path
) -> _WebhookCerts:
    """A CA named `ca_name` (valid for that name, as the cert rotator checks) and a serving
    certificate valid for the in-cluster Service name and 127.0.0.1; stored in the Secret the
    rotator reads and written to `cert_dir` where the webhook server reads them."""
    ca = pki.CertificateAuthority(ca_name, dns_names=(ca_name,), rsa_key=True)
    serving = ca.issue_server(
        ca_name, dns_names=[f"{service}.{namespace}.svc", "localhost"], ips=["127.0.0.1"]
    )
    cert_dir.mkdir(parents=True, exist_ok=True)
    serving.write(cert_dir, "tls")
    data = {
        "ca.crt": ca.pair.cert_pem,
        "ca.key": ca.pair.key_pem,
        "tls.crt": serving.cert_pem,
        "tls.key": serving.key_pem,
    }
    manifests.ensure_namespace(http, namespace)
    manifests.put_secret(http, namespace, secret, data)
    return _WebhookCerts(ca.pair.cert_pem, data)


def _ready_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/readyz"


def _kuberay_launch(context: EngineContext) -> EngineLaunch:
    health, metrics = free_ports(2)
    return EngineLaunch(
        name="kuberay",
        binary=context.engines_dir / "bin" / ENGINES["kuberay"].binary,
        args=[
            f"--metrics-addr=127.0.0.1:{metrics}",
            f"--health-probe-bind-address=127.0.0.1:{health}",
            "--enable-leader-election=false",
            "--log-stdout-encoder=console",
        ],
        ready_url=_ready_url(health),
        env={"KUBECONFIG": str(_identity_kubeconfig(context, "kuberay"))},
        ports={"kuberay-health": health, "kuberay-metrics": metrics},
    )


def _training_operator_launch(http: KubeHttp, context: EngineContext) -> EngineLaunch:
    health, metrics, webhook = free_ports(3)
    directory = _engine_dir(context, "training-operator")
    tmpdir = directory / "tmp"
    certs = _webhook_certs(
        http,
        ca_name="training-operator-ca",
        service="training-operator",
        namespace=TRAINING_OPERATOR_NAMESPACE,
        secret="training-operator-webhook-cert",
        cert_dir=tmpdir / "k8s-webhook-server" / "serving-certs",
    )
    _ensure_cert_check_file(certs.secret["tls.crt"])
    source = context.engines_dir / "manifests" / "training-operator" / "webhooks" / "manifests.yaml"
    validating = manifests.webhook_configuration(
        manifests.load_documents(source), "ValidatingWebhookConfiguration", source
    )
    manifests.apply(
        http,
        manifests.WEBHOOK_PATHS["ValidatingWebhookConfiguration"],
        manifests.loopback_webhooks(
            validating,
            name="validator.training-operator.kubeflow.org",
            base_url=f"https://127.0.0.1:{webhook}",
            ca_pem=certs.ca_pem,
            keep=lambda path: path.endswith("-kubeflow-org-v1-pytorchjob"),
        ),
    )
    return EngineLaunch(
        name="training-operator",
        binary=context.engines_dir / "bin" / ENGINES["training-operator"].binary,
        args=[
            f"--metrics-bind-address=127.0.0.1:{metrics}",
            f"--health-probe-bind-address=127.0.0.1:{health}",
            f"--webhook-server-port={webhook}",
            "--enable-scheme=pytorchjob",
            "--leader-elect=false",
        ],
        ready_url=_ready_url(health),
        env={
            "KUBECONFIG": str(_identity_kubeconfig(context, "training-operator")),
            "TMPDIR": str(tmpdir),
            "MY_POD_NAMESPACE": TRAINING_OPERATOR_NAMESPACE,
        },
        ports={
            "training-operator-health": health,
            "training-operator-metrics": metrics,
            "training-operator-webhook": webhook,
        },
    )


def _ensure_cert_check_file(cert_pem: bytes) -> None:
    """The training operator's rotator waits for this file to exist (any content will do)."""
    if TRAINING_OPERATOR_CERT_CHECK.exists():
        return
    try:
        TRAINING_OPERATOR_CERT_CHECK.parent.mkdir(parents=True, exist_ok=True)
        TRAINING_OPERATOR_CERT_CHECK.write_bytes(cert_pem)
    except OSError as error:
        raise manifests.EngineManifestError(
            f"the training operator needs a file at {TRAINING_OPERATOR_CERT_CHECK} "
            f"(its cert rotator checks that path): {error}; create it or leave the operator "
            "out with `--without training-operator`"
        ) from error


def _kueue_launch(
    http: KubeHttp, context: EngineContext, frameworks: Sequence[str]
) -> tuple[EngineLaunch, list[str]]:
    health, metrics, webhook = free_ports(3)
    directory = _engine_dir(context, "kueue")
    cert_dir = directory / "certs"
    certs = _webhook_certs(
        http,
        ca_name="kueue-ca",
        service="kueue-webhook-service",
        namespace=KUEUE_NAMESPACE,
        secret="kueue-webhook-server-cert",
        cert_dir=cert_dir,
    )
    base_url = f"https://127.0.0.1:{webhook}"
    source_dir = context.engines_dir / "manifests" / "kueue"
    crds = [
        manifests.with_conversion_webhook(crd, url=f"{base_url}/convert", ca_pem=certs.ca_pem)
        if crd["metadata"]["name"] in _KUEUE_CONVERTED_CRDS
        else crd
        for crd in manifests.load_crds(source_dir / "crds")
    ]
    for crd in crds:
        manifests.apply(http, manifests.CRD_PATH, crd)
    suffixes = tuple(_FRAMEWORK_WEBHOOK_SUFFIX[framework] for framework in frameworks)

    def keep(path: str) -> bool:
        return "-kueue-x-k8s-io-" in path or path.endswith(suffixes)

    source = source_dir / "webhooks" / "manifests.yaml"
    documents = manifests.load_documents(source)
    for kind, name in (
        ("MutatingWebhookConfiguration", "kueue-mutating-webhook-configuration"),
        ("ValidatingWebhookConfiguration", "kueue-validating-webhook-configuration"),
    ):
        configuration = manifests.webhook_configuration(documents, kind, source)
        manifests.apply(
            http,
            manifests.WEBHOOK_PATHS[kind],
            manifests.loopback_webhooks(
                configuration, name=name, base_url=base_url, ca_pem=certs.ca_pem, keep=keep
            ),
        )
    config = _kueue_config(
        health=health, metrics=metrics, webhook=webhook, cert_dir=cert_dir, frameworks=frameworks
    )
    config_path = directory / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    launch = EngineLaunch(
        name="kueue",
        binary=context.engines_dir / "bin" / ENGINES["kueue"].binary,
        args=[f"--config={config_path}"],
        ready_url=_ready_url(health),
        env={"KUBECONFIG": str(_identity_kubeconfig(context, "kueue"))},
        ports={"kueue-health": health, "kueue-metrics": metrics, "kueue-webhook": webhook},
    )
    return launch, [crd["metadata"]["name"] for crd in crds]


def _kueue_config(
    *, health: int, metrics: int, webhook: int, cert_dir: Path, frameworks: Sequence[str]
) -> dict[str, object]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for one loopback instance."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": "kueue-webhook-service",
            "webhookSecretName": "kueue-webhook-server-cert",
        },
        # The visibility API would need an APIService and a port of its own; not used here.
        # Workload slices (alpha in v0.17): an admitted job annotated
        # kueue.x-k8s.io/elastic-job resizes without eviction (cluster/core/engines.py).
        "featureGates": {"VisibilityOnDemand": False, "ElasticJobsViaWorkloadSlices": True},
        "integrations": {"frameworks": list(frameworks)},
    }
