"""Who each part of the development cluster is to the apiserver: the certificates, and the
kubeconfigs for the admin, each component and a ServiceAccount."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from tideshift.services.devcluster import pki


def write_pki(pki_dir: Path, *, server: str, admin_kubeconfig: Path) -> None:
    """The cluster CA, the apiserver's serving certificate, the ServiceAccount signing key, and
    a client certificate and kubeconfig for the admin and each component."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    ca = pki.CertificateAuthority()
    ca.pair.write(pki_dir, "ca")
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
    ).write(pki_dir, "apiserver")
    private_pem, public_pem = pki.service_account_signing_key()
    (pki_dir / "sa.key").touch(mode=0o600)
    (pki_dir / "sa.key").write_bytes(private_pem)
    (pki_dir / "sa.pub").write_bytes(public_pem)
    ca_pem = ca.pair.cert_pem
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
        pair.write(pki_dir, stem)
        path = admin_kubeconfig if stem == "admin" else pki_dir / f"{stem}.kubeconfig"
        write_kubeconfig(
            path,
            server=server,
            ca_pem=ca_pem,
            user=user,
            client_cert_pem=pair.cert_pem,
            client_key_pem=pair.key_pem,
        )


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
