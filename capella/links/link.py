"""One link: a named external cluster, as the API defines it, as it is stored, and as it is shown.

A definition (``PUT /v1/clusters/{name}``) decodes through ``wire.decode`` into
``wire.clusters.ClusterDefinition``; what its JSON types cannot say (the URL's form, a secret's
name, at most one credential, a password's username, the timeouts) is checked here, in the
words the API has always answered with. The record kept in the catalog (``LinkRecord``) decodes
the same way: one that no longer does is a ``CorruptData`` that the registry shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, get_args

import msgspec
from msgspec import UNSET, UnsetType

from capella.errors import CorruptData, InvalidConfig, InvalidRequest, UnknownField
from capella.wire.clusters import (
    CREDENTIALS,
    MAX_TIMEOUT,
    SECRET_NAME,
    ClusterCredentials,
    ClusterDefinition,
    ClusterInfo,
    ClusterTimeouts,
    ClusterTls,
    Compression,
)
from capella.wire.decode import decode
from capella.wire.fields import URL_EXCLUDED, seconds

# As CLUSTER_URL_PATTERN, but taking "@", which is refused in words (credentials in the URL).
_URL = re.compile(rf"https?://[^{URL_EXCLUDED}/]+(/[^{URL_EXCLUDED}]*)?")
_SECRET_NAME = re.compile(SECRET_NAME)
COMPRESSIONS: tuple[str, ...] = get_args(Compression)
# Checked on the value as it came (an integer from 10**12 is the original's nanoseconds), after
# every other field, as they always were.
TIMEOUTS = {"connect_timeout": 5.0, "timeout": 30.0}
# A field's wrong JSON type, in the words the API has always used; the order the fields are
# checked in, so the one named is the one it always was.
_WRONG_TYPE = {
    "url": "url must be an http:// or https:// URL",
    "username": "username must be a non-empty string",
    "password": "password must be a non-empty string",
    "password_secret": "password_secret must name a secret declared in [secrets]",
    "token": "token must be a non-empty string",
    "token_secret": "token_secret must name a secret declared in [secrets]",
    "compression": f"compression must be one of {', '.join(COMPRESSIONS)}",
    "verify_tls": "verify_tls must be true or false",
    "ca_file": "ca_file must be a file path",
}
# What a definition no longer takes, and why.
_REPLACED = {"password_env": "password_secret", "token_env": "token_secret"}


@dataclass(frozen=True, slots=True)
class Link:
    """A named external cluster. ``secret`` is the decrypted password or token, in memory only."""

    name: str
    url: str
    username: str | None = None
    secret: str | None = field(default=None, repr=False)
    secret_kind: str | None = None  # "password" or "token"
    secret_name: str | None = None  # the declared secret it comes from, when it is not stored
    verify_tls: bool = True
    ca_file: str | None = None
    # Defined by an admin, whose definitions may name any file (capella/file_access.py).
    by_admin: bool = False
    connect_timeout: float = 5.0
    timeout: float = 30.0
    compression: str = "none"
    # Why the link cannot be used (its stored credentials do not decrypt): shown, not hidden.
    error: str | None = None

    def info(self) -> ClusterInfo:
        """What the API shows: everything but the secret itself."""
        credentials = None
        if self.secret_kind is not None:
            source = f"secret:{self.secret_name}" if self.secret_name else "stored encrypted"
            credentials = ClusterCredentials(self.secret_kind, self.username, source)  # type: ignore[arg-type]  # "password" or "token"
        return ClusterInfo(
            name=self.name,
            url=self.url,
            credentials=credentials,
            tls=ClusterTls(self.verify_tls, self.ca_file),
            timeouts=ClusterTimeouts(self.connect_timeout, self.timeout),
            compression=self.compression,  # type: ignore[arg-type]  # one of COMPRESSIONS, checked by defined
            error=self.error,
        )

    def context(self) -> tuple[str, ...]:
        """What a stored secret of this link is bound to."""
        # "cluster link" is the stored ciphertexts' associated data: another word would leave
        # every stored secret undecryptable.
        return ("cluster link", self.name, self.url, self.secret_kind or "", self.username or "")


def defined(name: str, data: object, by_admin: bool) -> Link:
    """The link a ``PUT /v1/clusters/{name}`` body (or the same as a ``ClusterDefinition``)
    defines; ``InvalidRequest`` names the first bad field."""
    if isinstance(data, ClusterDefinition):
        data = msgspec.to_builtins(data)
    if not isinstance(data, dict):
        raise InvalidRequest("a cluster must be a JSON object")
    for old, new in _REPLACED.items():
        if old in data:
            raise InvalidRequest(
                f"{old} is no longer accepted: a cluster may not name the server's environment "
                f'variables. Ask the operator to declare the secret ([secrets.NAME] env = "VAR") '
                f'and give {new} = "NAME"',
                field=old,
            )
    # Unknown fields first (by name), then the others in the order they are checked.
    order = sorted(k for k in data if k not in _WRONG_TYPE and k not in TIMEOUTS)
    try:
        body = decode({k: data[k] for k in [*order, *_WRONG_TYPE] if k in data}, ClusterDefinition)
    except UnknownField as exc:
        found = str(exc.details["field"])
        raise UnknownField(f"unknown field {found!r}", field=found, known=exc.known) from None
    except InvalidRequest as exc:
        # What was always checked before this field: its own words come only after them.
        _credentials(data)
        bad = str(exc.details["field"])
        raise InvalidRequest(_WRONG_TYPE.get(bad, exc.message), field=bad) from None
    url, kind, secret, secret_name = _credentials(msgspec.structs.asdict(body))
    timeouts = {k: duration(data.get(k, default), k) for k, default in TIMEOUTS.items()}
    return Link(
        name=name,
        url=url.rstrip("/"),
        username=body.username,
        secret=secret,
        secret_kind=kind,
        secret_name=secret_name,
        verify_tls=body.verify_tls,
        ca_file=body.ca_file,
        by_admin=by_admin,
        connect_timeout=timeouts["connect_timeout"],
        timeout=timeouts["timeout"],
        compression=body.compression,
    )


def _credentials(values: dict[str, Any]) -> tuple[str, str | None, str | None, str | None]:
    """The url, and the credential's kind, stored secret and declared secret's name: the rules
    a definition's JSON types do not say, in the order they have always been checked."""
    url = values.get("url")
    if not isinstance(url, str) or not _URL.fullmatch(url):
        raise InvalidRequest(_WRONG_TYPE["url"], field="url")
    if "@" in url.split("/")[2]:
        # The URL is shown and logged: credentials go in username/password, never in it.
        raise InvalidRequest("url must not hold credentials: give username and password", field="url")
    given = [k for k in CREDENTIALS if values.get(k) is not None]
    if len(given) > 1:
        raise InvalidRequest(f"give only one of {', '.join(given)}", field=given[1])
    username = values.get("username")
    if username is not None and (not isinstance(username, str) or not username):
        raise InvalidRequest(_WRONG_TYPE["username"], field="username")
    if not given:
        return url, None, None, None
    kind, value = given[0].split("_")[0], values[given[0]]
    if kind == "password" and username is None:
        raise InvalidRequest("a password needs a username", field="username")
    named = given[0].endswith("_secret")
    if not isinstance(value, str) or not (_SECRET_NAME.fullmatch(value) if named else value):
        raise InvalidRequest(_WRONG_TYPE[given[0]], field=given[0])
    return url, kind, None if named else value, value if named else None


def duration(value: object, field: str) -> float:
    """Seconds greater than 0 and at most a day from ``"30s"`` or a number, with an error that
    names the field."""
    try:
        found = seconds(value, positive=True)
    except ValueError as exc:
        text = str(exc)
        raise InvalidRequest(
            f"{field} {text}" if text.startswith("must") else f"{field}: {text}", field=field
        ) from None
    if found > MAX_TIMEOUT:
        raise InvalidRequest(f"{field} must be at most {MAX_TIMEOUT:g} seconds (a day)", field=field)
    return found


# --- the stored record ---------------------------------------------------------------------


class StoredCredentials(msgspec.Struct, kw_only=True):
    """A link's credentials as stored: which kind, whose, and the declared secret's name or the
    sealed value (``capella/auth/sealed.py``); ``env`` only in records from before secrets."""

    kind: str | None = None
    username: str | None = None
    secret: str | None = None
    encrypted: str | None = None
    env: str | UnsetType = UNSET  # never written


class LinkRecord(msgspec.Struct, kw_only=True):
    """One link in the catalog's ``CLUSTERS`` document (docs/format.md), under its name."""

    url: str
    tls: ClusterTls
    timeouts: ClusterTimeouts
    compression: Compression
    credentials: StoredCredentials | None = None
    # Missing from a definition stored before it was kept: as anyone's.
    by_admin: bool = False


def record_of(link: Link, encrypted: str | None) -> LinkRecord:
    """What the catalog keeps of ``link``; ``encrypted``: its secret, sealed (None: not stored)."""
    credentials = None
    if link.secret_kind is not None:
        credentials = StoredCredentials(
            kind=link.secret_kind, username=link.username, secret=link.secret_name, encrypted=encrypted
        )
    return LinkRecord(
        url=link.url,
        tls=ClusterTls(link.verify_tls, link.ca_file),
        timeouts=ClusterTimeouts(link.connect_timeout, link.timeout),
        compression=link.compression,  # type: ignore[arg-type]  # one of COMPRESSIONS, checked by defined
        credentials=credentials,
        by_admin=link.by_admin,
    )


def stored(name: str, entry: object) -> tuple[Link, str | None]:
    """The link a catalog record holds, and its sealed secret (None: none stored)."""
    try:
        record = decode(entry, LinkRecord)
    except InvalidRequest as exc:
        raise CorruptData(f"its stored definition is not valid: {exc.message}") from None
    credentials = record.credentials or StoredCredentials()
    if isinstance(credentials.env, str) and credentials.env:
        raise InvalidConfig(
            f"its credentials come from the environment variable {credentials.env}, which clusters "
            "may no longer name: declare it in [secrets] and give password_secret or token_secret"
        )
    link = Link(
        name=name,
        url=record.url,
        username=credentials.username,
        secret_kind=credentials.kind,
        secret_name=credentials.secret,
        verify_tls=record.tls.verify,
        ca_file=record.tls.ca_file,
        by_admin=record.by_admin,
        connect_timeout=record.timeouts.connect,
        timeout=record.timeouts.request,
        compression=record.compression,
    )
    return link, credentials.encrypted
