"""The engines' own CRDs and webhook configurations, made to work on the local control plane.

tests/cluster/build_engines.sh copies them out of each engine's Go module into the cache. Here
their webhooks, written for an in-cluster Service, are pointed at the engine's loopback port
(`url: https://127.0.0.1:PORT/...` with the engine's CA), and the objects are created or
replaced through the apiserver. Blocking, like the rest of the development cluster.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from tideshift.services.cluster.adapters.http import KubeHttp

Manifest = dict[str, Any]

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WEBHOOK_PATHS = {
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    ),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    ),
}


class EngineManifestError(RuntimeError):
    """An engine's copied manifests are missing or not what this module expects."""


def load_documents(path: Path) -> list[Manifest]:
    """The YAML documents of one file (empty documents dropped)."""
    try:
        text = path.read_text()
    except OSError as error:
        raise EngineManifestError(f"cannot read {path}: {error}") from error
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        raise EngineManifestError(f"{path} is not valid YAML: {error}") from error
    return [document for document in documents if isinstance(document, dict)]


def load_crds(directory: Path, *, only: Iterable[str] | None = None) -> list[Manifest]:
    """The CRDs in `directory` (`only`: their metadata names), sorted by file name."""
    wanted = set(only) if only is not None else None
    crds = []
    for path in sorted(directory.glob("*.yaml")):
        for document in load_documents(path):
            if document.get("kind") != "CustomResourceDefinition":
                continue
            if not isinstance(document.get("metadata"), dict) or not document["metadata"].get(
                "name"
            ):
                raise EngineManifestError(f"a CustomResourceDefinition in {path} has no name")
            if not isinstance(document.get("spec"), dict):
                raise EngineManifestError(
                    f"CustomResourceDefinition {document['metadata']['name']} in {path}: "
                    "spec must be a mapping"
                )
            crds.append(document)
    if wanted is not None:
        crds = [crd for crd in crds if crd["metadata"]["name"] in wanted]
        missing = wanted - {crd["metadata"]["name"] for crd in crds}
        if missing:
            raise EngineManifestError(f"CRDs {sorted(missing)} not found in {directory}")
    if not crds:
        raise EngineManifestError(f"no CustomResourceDefinition in {directory}")
    return crds


def with_conversion_webhook(crd: Manifest, *, url: str, ca_pem: bytes) -> Manifest:
    """`crd` converting between its versions through the engine's /convert endpoint."""
    spec = {
        **crd["spec"],
        "conversion": {
            "strategy": "Webhook",
            "webhook": {
                "clientConfig": {"url": url, "caBundle": _b64(ca_pem)},
                "conversionReviewVersions": ["v1"],
            },
        },
    }
    return {**crd, "spec": spec}


def loopback_webhooks(
    configuration: Manifest,
    *,
    name: str,
    base_url: str,
    ca_pem: bytes,
    keep: Callable[[str], bool],
) -> Manifest:
    """A webhook configuration renamed `name`, keeping the webhooks whose service path passes
    `keep`, each calling `base_url + path` and trusting `ca_pem`."""
    webhooks = []
    for webhook in configuration.get("webhooks", []):
        path = webhook.get("clientConfig", {}).get("service", {}).get("path", "")
        if not path or not keep(path):
            continue
        client_config = {"url": f"{base_url}{path}", "caBundle": _b64(ca_pem)}
        webhooks.append({**webhook, "clientConfig": client_config})
    return {
        "apiVersion": configuration["apiVersion"],
        "kind": configuration["kind"],
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "tideshift-dev"}},
        "webhooks": webhooks,
    }


def webhook_configuration(documents: Sequence[Manifest], kind: str, source: Path) -> Manifest:
    """The first `kind` in `documents`, checked for the fields loopback_webhooks reads."""
    for document in documents:
        if document.get("kind") != kind:
            continue
        webhooks = document.get("webhooks", [])
        if not isinstance(document.get("apiVersion"), str):
            raise EngineManifestError(f"{kind} in {source}: apiVersion must be a string")
        if not isinstance(webhooks, list) or not all(
            isinstance(webhook, dict)
            and isinstance(webhook.get("clientConfig", {}), dict)
            and isinstance(webhook.get("clientConfig", {}).get("service", {}), dict)
            for webhook in webhooks
        ):
            raise EngineManifestError(
                f"{kind} in {source}: webhooks must be a list of mappings, each with a "
                "clientConfig mapping (its service a mapping)"
            )
        return document
    raise EngineManifestError(f"no {kind} in {source}")


def apply(http: KubeHttp, collection: str, manifest: Manifest) -> None:
    """Creates the cluster-scoped object, or replaces the one already there (e.g. the
    structural PyTorchJob CRD the cluster installs when no training operator runs)."""
    name = manifest["metadata"]["name"]
    try:
        http.json("POST", collection, body=manifest)
        return
    except ApiException as error:
        if error.status != 409:
            raise EngineManifestError(
                f"creating {manifest['kind']} {name} failed: {error.status} {error.reason}: "
                f"{(error.body or '')[:500]}"
            ) from error
    current = http.get(f"{collection}/{name}")
    metadata = {**manifest["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
    try:
        http.json("PUT", f"{collection}/{name}", body={**manifest, "metadata": metadata})
    except ApiException as error:
        raise EngineManifestError(
            f"replacing {manifest['kind']} {name} failed: {error.status} {error.reason}: "
            f"{(error.body or '')[:500]}"
        ) from error


def wait_established(http: KubeHttp, names: Sequence[str], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for name in names:
        while not _established(http.get(f"{CRD_PATH}/{name}")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not established within {timeout:.0f}s")
            time.sleep(0.1)


def _established(crd: Manifest) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def ensure_namespace(http: KubeHttp, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    try:
        http.json("POST", "/api/v1/namespaces", body=body)
    except ApiException as error:
        if error.status != 409:
            raise


def put_secret(http: KubeHttp, namespace: str, name: str, data: dict[str, bytes]) -> None:
    """Creates or replaces an Opaque Secret."""
    body: Manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": {key: _b64(value) for key, value in data.items()},
    }
    collection = f"/api/v1/namespaces/{namespace}/secrets"
    try:
        http.json("POST", collection, body=body)
    except ApiException as error:
        if error.status != 409:
            raise
        http.json("PUT", f"{collection}/{name}", body=body)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
