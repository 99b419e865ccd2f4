"""A thin, typed door to the Kubernetes API over kubernetes_asyncio's authenticated client.

kubernetes_asyncio does what a client must get right — kubeconfig and in-cluster credentials,
token refresh, TLS — and this module sends requests through it with ``_preload_content=False``,
so responses are read as bytes and decoded by :mod:`fleetlog.backends.kubernetes.objects`
(msgspec) instead of the generated models, which are far too slow for thousands of pods.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

import aiohttp
import msgspec
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration

from fleetlog.backends.kubernetes.objects import STATUS

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
Query = Sequence[tuple[str, str]]


class KubeApiError(Exception):
    """The API server answered with an error status (``status``: the HTTP code)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class KubeConfigError(Exception):
    """The credentials to reach the API server cannot be loaded (the message says from where)."""


class KubeUnreachableError(Exception):
    """The API server could not be reached (refused, reset, timed out)."""


def api_error(status: int, body: bytes) -> KubeApiError:
    try:
        s = STATUS.decode(body)
        return KubeApiError(status, s.reason, s.message)
    except msgspec.DecodeError:
        return KubeApiError(status, "", body[:500].decode("utf-8", "replace"))


class KubeApi:
    """Raw JSON requests and watch streams against one API server."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, max_connections: int = 100) -> KubeApi:
        """From ``kubeconfig`` (a path), else in a pod the service account, else ``~/.kube/config``."""
        configuration = Configuration()
        in_cluster = kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ
        where = "the in-cluster service account" if in_cluster else (kubeconfig or "~/.kube/config")
        if kubeconfig is not None and not os.path.isfile(kubeconfig):
            raise KubeConfigError(f"kubeconfig {kubeconfig}: no such file")
        try:
            if in_cluster:
                kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                await kube_config.load_kube_config(
                    config_file=kubeconfig, client_configuration=configuration, persist_config=False
                )
        except Exception as exc:  # ConfigException, a YAML error, OSError...: the file is the problem
            raise KubeConfigError(f"cannot load the Kubernetes credentials from {where}: {exc}") from None
        configuration.connection_pool_maxsize = max_connections
        return cls(ApiClient(configuration))

    async def close(self) -> None:
        await self.client.close()

    async def _send(
        self,
        method: str,
        path: str,
        query: Query,
        body: object,
        content_type: str,
        timeout: float | aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": JSON, "Content-Type": content_type}
        try:
            response: aiohttp.ClientResponse = await self.client.call_api(
                path,
                method,
                query_params=list(query),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise KubeUnreachableError(f"{method} {path}: {e!r}") from e
        return response

    async def request(
        self,
        method: str,
        path: str,
        query: Query = (),
        body: Mapping[str, Any] | None = None,
        content_type: str = JSON,
        timeout_s: float = 30.0,
    ) -> bytes:
        """The response body; :class:`KubeApiError` for a status outside 2xx."""
        response = await self._send(method, path, query, body, content_type, timeout_s)
        async with response:
            try:
                data = await response.read()
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as e:
                raise KubeUnreachableError(f"{method} {path}: {e!r}") from e
        if not 200 <= response.status <= 299:
            raise api_error(response.status, data)
        return data

    async def stream(self, path: str, query: Query, timeout_s: float) -> AsyncIterator[bytes]:
        """The lines of a streaming (watch) response, until the server ends it."""
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        response = await self._send("GET", path, query, None, JSON, timeout)
        async with response:
            if not 200 <= response.status <= 299:
                raise api_error(response.status, await response.read())
            try:
                async for line in response.content:
                    if line.strip():
                        yield line
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as e:
                raise KubeUnreachableError(f"watch {path}: {e!r}") from e
