"""A push handler's definition: the webhook it delivers to, and how (``PushParams``).

Credentials never appear in the params: ``secret_env``, ``token_env`` and ``basic_env`` name
environment variables, read when the handler is built (a variable that is not set refuses
the definition). The retry fields are those of an ack-mode subscription's policy.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass, field
from typing import Any

from capella.core.retry import RetryPolicy, parse_policy
from capella.errors import InvalidRequest
from capella.handlers.delivery import Credentials
from capella.handlers.params import Params, segment_ranges

ORDERINGS = ("unordered", "by_segment", "ordered")
# The handler holds its claims until it answers them; a new run takes back what an old one
# held, so the lease only matters when the handler is stopped for longer than this.
LEASE = 12 * 3600.0
# What one handler may hold, so a definition cannot make the broker buffer without bound
# (docs/push.md): messages in flight (concurrency x batch), and the seconds one request may
# keep a connection and its batch (a receiver that needs longer should answer 202 and work on).
MAX_IN_FLIGHT = 10_000
MAX_TIMEOUT = 60.0
_POLICY_FIELDS = ("max_attempts", "backoff", "delay", "max_delay", "jitter", "dead_letter")
_URL = re.compile(r"https?://[^\s/?#]+([/?#][^\s]*)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HEADER_NAME = re.compile(r"[!#$&'*+.^_`|~0-9A-Za-z-]+")
# Set by the handler itself: a params header of these names would be overwritten or unsafe.
_RESERVED = ("authorization", "idempotency-key", "content-length", "host", "transfer-encoding", "user-agent")


@dataclass(frozen=True, slots=True)
class PushParams:
    url: str
    subscription: str
    batch: int = 1
    ordering: str = "unordered"
    concurrency: int = 4
    timeout: float = 10.0
    headers: dict[str, str] = field(default_factory=dict)
    segments: tuple[tuple[int, int], ...] | None = None
    policy: RetryPolicy = field(default_factory=lambda: RetryPolicy(lease=LEASE))
    secret_env: str | None = None
    token_env: str | None = None
    basic_env: str | None = None
    wait: float = 2.0
    interval: float = 0.0

    @classmethod
    def parse(cls, data: object, handler: str) -> PushParams:
        params = Params(
            data,
            {
                "url",
                "subscription",
                "batch",
                "ordering",
                "concurrency",
                "timeout",
                "headers",
                "segments",
                "secret_env",
                "token_env",
                "basic_env",
                "wait",
                *_POLICY_FIELDS,
            },
        )
        url = params.raw("url")
        if not isinstance(url, str) or not _URL.fullmatch(url):
            raise InvalidRequest("params.url must be an http:// or https:// URL", field="params.url")
        if "@" in url.split("/")[2]:
            # The URL is shown and logged: credentials come from token_env or basic_env.
            raise InvalidRequest(
                "params.url must not hold credentials: use token_env or basic_env", field="params.url"
            )
        subscription = params.raw("subscription") or f"push-{handler}"
        if not isinstance(subscription, str):
            raise InvalidRequest("params.subscription must be a name", field="params.subscription")
        ordering = params.raw("ordering") or "unordered"
        if ordering not in ORDERINGS:
            raise InvalidRequest(
                f"params.ordering must be one of {', '.join(ORDERINGS)}", field="params.ordering"
            )
        batch = params.integer("batch", 1) or 1
        if batch > 10_000:
            raise InvalidRequest("params.batch must be at most 10000", field="params.batch")
        concurrency = params.integer("concurrency", 4) or 4
        if concurrency > 1000:
            raise InvalidRequest("params.concurrency must be at most 1000", field="params.concurrency")
        in_flight = (1 if ordering == "ordered" else concurrency) * batch
        if in_flight > MAX_IN_FLIGHT:
            raise InvalidRequest(
                f"params.concurrency x params.batch must be at most {MAX_IN_FLIGHT} messages in flight, "
                f"not {in_flight}",
                field="params.batch",
            )
        timeout = params.duration("timeout", 10.0) or 10.0
        if timeout > MAX_TIMEOUT:
            raise InvalidRequest(
                f"params.timeout must be at most {MAX_TIMEOUT:g} seconds", field="params.timeout"
            )
        secrets = {name: _env_name(params, name) for name in ("secret_env", "token_env", "basic_env")}
        if secrets["token_env"] and secrets["basic_env"]:
            raise InvalidRequest("give token_env or basic_env, not both", field="params.basic_env")
        return cls(
            url=url,
            subscription=subscription,
            batch=batch,
            ordering=ordering,
            concurrency=1 if ordering == "ordered" else concurrency,
            timeout=timeout,
            wait=params.duration("wait", 2.0, positive=False) or 0.0,
            headers=_headers(params.raw("headers")),
            segments=segment_ranges(params.raw("segments"), "params.segments"),
            policy=_policy(params),
            secret_env=secrets["secret_env"],
            token_env=secrets["token_env"],
            basic_env=secrets["basic_env"],
        )

    def to_dict(self) -> dict[str, Any]:
        policy = self.policy.to_dict()
        return {
            "url": self.url,
            "subscription": self.subscription,
            "batch": self.batch,
            "ordering": self.ordering,
            "concurrency": self.concurrency,
            "timeout": self.timeout,
            "wait": self.wait,
            "headers": dict(self.headers),
            "segments": None if self.segments is None else [list(s) for s in self.segments],
            **{name: policy[name] for name in _POLICY_FIELDS},
            "secret_env": self.secret_env,
            "token_env": self.token_env,
            "basic_env": self.basic_env,
        }

    def credentials(self) -> Credentials:
        """The secrets the variables hold now; a variable that is not set is an error."""
        values = {name: _env(self, name) for name in ("secret_env", "token_env", "basic_env")}
        authorization = None
        if values["token_env"] is not None:
            authorization = f"Bearer {values['token_env']}"
        elif values["basic_env"] is not None:
            if ":" not in values["basic_env"]:
                raise InvalidRequest(
                    f"params.basic_env: {self.basic_env} must hold user:password", field="params.basic_env"
                )
            authorization = "Basic " + base64.b64encode(values["basic_env"].encode()).decode("ascii")
        secret = values["secret_env"]
        return Credentials(authorization, None if secret is None else secret.encode())


def _env_name(params: Params, name: str) -> str | None:
    value = params.raw(name)
    if value is None:
        return None
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise InvalidRequest(f"params.{name} must name an environment variable", field=f"params.{name}")
    return value


def _env(params: PushParams, name: str) -> str | None:
    variable = getattr(params, name)
    if variable is None:
        return None
    value = os.environ.get(variable)
    if value is None or value == "":
        raise InvalidRequest(
            f"params.{name}: the environment variable {variable} is not set", field=f"params.{name}"
        )
    return value


def _headers(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest("params.headers must be an object of strings", field="params.headers")
    for name, text in value.items():
        if not _HEADER_NAME.fullmatch(name) or not isinstance(text, str) or any(c in text for c in "\r\n\0"):
            raise InvalidRequest(f"params.headers: {name!r} is not a valid header", field="params.headers")
        if name.lower() in _RESERVED or name.lower().startswith("capella-"):
            raise InvalidRequest(
                f"params.headers: {name} is set by the handler (credentials: token_env or basic_env)",
                field="params.headers",
            )
    return dict(value)


def _policy(params: Params) -> RetryPolicy:
    given = {name: params.raw(name) for name in _POLICY_FIELDS if params.has(name)}
    try:
        return parse_policy(given, RetryPolicy(lease=LEASE))
    except InvalidRequest as exc:
        where = str(exc.details.get("field", "params")).replace("policy.", "params.")
        raise InvalidRequest(exc.message.replace("policy.", "params."), field=where) from None
