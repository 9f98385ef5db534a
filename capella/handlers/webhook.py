"""A push handler's definition: the webhook it delivers to, and how (``PushParams``).

Credentials never appear in the params: ``secret`` (the HMAC signing secret), ``token`` (a
bearer token) and ``basic`` (``user:password``) name secrets the operator declared in
``[secrets.NAME]``, which the handler's user must be granted (``allow:secret:use:NAME``).
They are read when the handler is defined and again at the start of every pass, as its user,
so a revoked grant stops it and a rotated value is picked up. The retry fields are those of
an ack-mode subscription's policy.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

from capella.auth.rule import Identity
from capella.auth.secret import Secrets
from capella.core.work.retry import RetryPolicy, parse_policy
from capella.errors import InvalidRequest
from capella.handlers.base import HandlerParams
from capella.handlers.delivery import Credentials
from capella.handlers.params import Params, refuse_env_params, secret_name, segment_ranges

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
# The credentials params, each naming a declared secret; the old *_env forms named variables
# of the server's environment, which let any definer read any of them (issue 20).
SECRET_PARAMS = ("secret", "token", "basic")
_REPLACED = {"secret_env": "secret", "token_env": "token", "basic_env": "basic"}
_HEADER_NAME = re.compile(r"[!#$&'*+.^_`|~0-9A-Za-z-]+")
# Set by the handler itself: a params header of these names would be overwritten or unsafe.
_RESERVED = ("authorization", "idempotency-key", "content-length", "host", "transfer-encoding", "user-agent")


@dataclass(frozen=True, slots=True)
class PushParams(HandlerParams):
    url: str
    subscription: str
    batch: int = 1
    ordering: str = "unordered"
    concurrency: int = 4
    timeout: float = 10.0
    headers: dict[str, str] = field(default_factory=dict)
    segments: tuple[tuple[int, int], ...] | None = None
    policy: RetryPolicy = field(default_factory=lambda: RetryPolicy(lease=LEASE))
    secret: str | None = None
    token: str | None = None
    basic: str | None = None
    wait: float = 2.0
    interval: float = 0.0

    @classmethod
    def parse(cls, data: object, handler: str) -> PushParams:
        refuse_env_params(data, _REPLACED)
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
                *SECRET_PARAMS,
                "wait",
                *_POLICY_FIELDS,
            },
        )
        url = params.raw("url")
        if not isinstance(url, str) or not _URL.fullmatch(url):
            raise InvalidRequest("params.url must be an http:// or https:// URL", field="params.url")
        if "@" in url.split("/")[2]:
            # The URL is shown and logged: credentials come from the token or basic secret.
            raise InvalidRequest(
                "params.url must not hold credentials: use token or basic (secret names)", field="params.url"
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
        secrets = {name: secret_name(params, name) for name in SECRET_PARAMS}
        if secrets["token"] and secrets["basic"]:
            raise InvalidRequest("give token or basic, not both", field="params.basic")
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
            secret=secrets["secret"],
            token=secrets["token"],
            basic=secrets["basic"],
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
            "secret": self.secret,
            "token": self.token,
            "basic": self.basic,
        }

    def credentials(self, secrets: Secrets, identity: Identity) -> Credentials:
        """The values of the named secrets now, as ``identity`` may use them."""
        values = {
            name: None
            if getattr(self, name) is None
            else secrets.use(getattr(self, name), identity, f"params.{name}")
            for name in SECRET_PARAMS
        }
        authorization = None
        if values["token"] is not None:
            authorization = f"Bearer {values['token']}"
        elif values["basic"] is not None:
            if ":" not in values["basic"]:
                raise InvalidRequest(
                    f"params.basic: secret {self.basic!r} must hold user:password", field="params.basic"
                )
            authorization = "Basic " + base64.b64encode(values["basic"].encode()).decode("ascii")
        secret = values["secret"]
        return Credentials(authorization, None if secret is None else secret.encode())


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
                f"params.headers: {name} is set by the handler (credentials: params.token or params.basic)",
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
