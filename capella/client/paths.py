"""The API's paths and query parameters as the client builds them (names are URL-quoted)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson

from capella.client.message import Segments, segments_param


def params(*, segments: Segments | None = None, **values: object) -> dict[str, str]:
    params = {key: str(value) for key, value in values.items() if value is not None}
    if segments is not None:
        params["segments"] = segments_param(segments)
    return params


def with_filters(
    params: dict[str, str], headers: Mapping[str, str] | None, json: Mapping[str, Any] | None
) -> dict[str, str]:
    """``params`` plus ``header.<name>=value`` and ``json.<dotted.path>=<JSON value>`` filters."""
    for key, value in (headers or {}).items():
        params[f"header.{key}"] = value
    for path, value in (json or {}).items():
        params[f"json.{path}"] = orjson.dumps(value).decode()
    return params


def queue_path(queue: str, *rest: str) -> str:
    return "/".join(("/v1/queues", quote(queue, safe=""), *rest))


def topic_path(name: str) -> str:
    return "/".join(("/v1/topics", quote(name, safe="")))


def subscription_path(queue: str, name: str, *rest: str) -> str:
    return queue_path(queue, "subscriptions", quote(name, safe=""), *rest)


def handler_path(name: str, *rest: str) -> str:
    return "/".join(("/v1/handlers", quote(name, safe=""), *rest))


def cluster_path(name: str, *rest: str) -> str:
    return "/".join(("/v1/clusters", quote(name, safe=""), *rest))


def user_path(name: str, *rest: str) -> str:
    return "/".join(("/v1/users", quote(name, safe=""), *rest))
