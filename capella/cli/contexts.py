"""Saved contexts: named servers the CLI talks to, in ``$XDG_CONFIG_HOME/capella/contexts.toml``.

```toml
current = "dc1"

[contexts."dc1"]
url = "https://dc1.example.com:8676"
user = "alice"                      # the password still comes from $CAPELLA_PASSWORD or a prompt
token_file = "/home/alice/.config/capella/dc1.token"   # or a bearer token, read from this file
ca_file = "/home/alice/.config/capella/dc1-ca.pem"      # trust this CA for https
```

The file holds no secret: a password is never stored, and a token only by the file it is in
(as ``kubectl``'s ``tokenFile``), so the contexts can be shown and copied safely. It is still
written with mode 0600 in a 0700 directory, atomically (``capella.fsync.write_atomic``).

Which server a command talks to (``choose``): ``--url``, else ``$CAPELLA_URL``, else the
context ``--context`` (or ``$CAPELLA_CONTEXT``) names, else the current context, else
http://127.0.0.1:8676. A context travels whole: its user, token and CA are used only with its
own URL, so credentials never go to a server the context does not name. Explicit credentials
(``--user``, ``$CAPELLA_TOKEN``, ``$CAPELLA_USER``) still win over the context's.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import msgspec

from capella.errors import ContextNotFound, InvalidConfig
from capella.fsync import write_atomic

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")


class Context(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One saved server: where it is, who to be there, and which CA to trust."""

    url: str
    user: str | None = None
    token_file: str | None = None
    ca_file: str | None = None


class Contexts(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The whole file."""

    current: str | None = None
    contexts: dict[str, Context] = msgspec.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Target:
    """The server a command talks to, and why: ``source`` is shown by ``context show``."""

    url: str
    source: str
    name: str | None = None
    context: Context | None = None


def directory() -> Path:
    """``$XDG_CONFIG_HOME/capella``, or ``~/.config/capella`` (the XDG default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "capella"


def path() -> Path:
    return directory() / "contexts.toml"


def load() -> Contexts:
    """The saved contexts; none when the file does not exist."""
    file = path()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Contexts()
    except OSError as exc:
        raise InvalidConfig(f"cannot read {file}: {exc.strerror}") from None
    try:
        return msgspec.convert(tomllib.loads(text), Contexts)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise InvalidConfig(f"{file}: {exc}") from None


def save(contexts: Contexts) -> Path:
    """Write the file atomically, 0600 in a 0700 directory; the path written."""
    folder = directory()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkdir leaves an existing directory's mode alone; this one is ours, so narrow it.
    folder.chmod(0o700)
    file = folder / "contexts.toml"
    write_atomic(file, _toml(contexts).encode("utf-8"))
    return file


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise InvalidConfig(f"context name {name!r}: use letters, digits, '_', '.' and '-' (at most 64)")
    return name


def choose(url: str | None, name: str | None, default_url: str) -> Target:
    """The server for this command: see the module's docstring for the order."""
    if url:
        return Target(url, "--url")
    if env_url := os.environ.get("CAPELLA_URL"):
        return Target(env_url, "CAPELLA_URL")
    source = "--context"
    if not name and (name := os.environ.get("CAPELLA_CONTEXT")):
        source = "CAPELLA_CONTEXT"
    contexts = load()
    if not name:
        name, source = contexts.current, "the current context"
    if not name:
        return Target(default_url, "the default")
    context = contexts.contexts.get(name)
    if context is None:
        raise ContextNotFound(f"no context named {name!r} ({source}): see `capella context list`")
    return Target(context.url, source, name, context)


def token_of(context: Context) -> str | None:
    """The bearer token in the context's ``token_file``, if it has one."""
    if context.token_file is None:
        return None
    file = Path(context.token_file).expanduser()
    try:
        token = file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InvalidConfig(f"cannot read the token file {file}: {exc.strerror}") from None
    if not token:
        raise InvalidConfig(f"the token file {file} is empty")
    return token


def _toml(contexts: Contexts) -> str:
    lines = ["# Capella CLI contexts: written by `capella context add|use|remove`.", ""]
    if contexts.current is not None:
        lines += [f"current = {_string(contexts.current)}", ""]
    for name, context in sorted(contexts.contexts.items()):
        lines.append(f"[contexts.{_string(name)}]")
        for key, value in msgspec.structs.asdict(context).items():
            if value is not None:
                lines.append(f"{key} = {_string(value)}")
        lines.append("")
    return "\n".join(lines)


def _string(value: str) -> str:
    # A TOML basic string: JSON's escapes are TOML's too, but TOML also wants DEL escaped.
    return msgspec.json.encode(value).decode().replace("\x7f", "\\u007f")
