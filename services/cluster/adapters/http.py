"""Raw JSON requests through the official client's `ApiClient` (auth, TLS, proxies, retries).

The generated typed methods deserialise every answer into model classes, which costs
milliseconds per pod and drops fields the client does not know. The watcher and the adapters
need neither, so they send requests through the same `ApiClient` and work on plain dicts.
All calls block: run them in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

JsonObject = dict[str, Any]
Timeout = float | tuple[float, float]
MERGE_PATCH = "application/merge-patch+json"


class KubeHttp:
    """Blocking JSON requests to one apiserver."""

    def __init__(self, api_client: ApiClient, *, timeout: Timeout = (5.0, 30.0)) -> None:
        self.api_client = api_client
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: object | None = None,
        content_type: str = "application/json",
        timeout: Timeout | None = None,
    ) -> Any:
        """The urllib3 response, not yet read; ApiException for any non-2xx answer."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        serialized = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*serialized, _request_timeout=timeout or self.timeout)
        if not 200 <= response.status <= 299:
            response.read()  # type: ignore[no-untyped-call]
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response

    def json(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: object | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        response = self.request(method, path, query=query, body=body, content_type=content_type)
        try:
            data = response.data
        finally:
            response.release_conn()
        parsed = json.loads(data)
        if not isinstance(parsed, dict):
            raise ValueError(f"{method} {path}: expected a JSON object")
        return parsed

    def get(self, path: str, *, query: Sequence[tuple[str, str]] = ()) -> JsonObject:
        return self.json("GET", path, query=query)

    def lines(self, response: Any) -> Iterator[bytes]:
        """Newline-separated records of a streamed (watch) answer, as they arrive."""
        pending = b""
        for chunk in response.stream(None, decode_content=True):
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip():
                    yield line
        if pending.strip():
            yield pending


def status_of(error: BaseException) -> int | None:
    """The HTTP status of an ApiException, None for anything else (network errors...)."""
    if isinstance(error, ApiException):
        return int(error.status) if error.status is not None else None
    return None


def message_of(error: BaseException) -> str:
    """The apiserver's own words for a refused request (its Status `message`: an admission
    webhook's or policy's reason, a validation error), "" when the answer carries none."""
    body = getattr(error, "body", None) if isinstance(error, ApiException) else None
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body:
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return message.strip() if isinstance(message, str) else ""
