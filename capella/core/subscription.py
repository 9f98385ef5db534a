"""Named subscriptions of a queue: cursors (the last-read id, never moving backwards on commit)
and ack-mode subscriptions (work queues, whose state lives in ``capella.core.work.work_queue``).

A cursor committed by a consumer group also keeps the group (its own name, which the
subscription's name may not be able to hold) and the metadata of the group's last commit; both
are optional, bounded (``capella.core.limits``), and absent from the saved forms when None.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson

from capella.core.definition import check_name
from capella.core.limits import check_cursor, check_group, check_metadata
from capella.core.work.retry import RetrySettings, parse_policy
from capella.errors import CorruptData, InvalidRequest, SubscriptionNotFound, WrongSubscriptionMode

CURSOR = "cursor"
ACK = "ack"


@dataclass(frozen=True, slots=True)
class SubscriptionState:
    name: str
    last_id: int
    replica: bool
    created: float
    updated: float
    mode: str = CURSOR
    policy: RetrySettings | None = None  # ack mode only
    group: str | None = None  # cursors: the group that commits it (a consumer group's id)
    metadata: str | None = None  # cursors: what the group's last commit said beside the id


class Subscriptions:
    """The subscriptions of one queue and their persisted forms: a JSON document of them all
    (``dump``/``load``) and a record per change (``take_records``/``apply``), for a change log."""

    def __init__(self) -> None:
        self._subs: dict[str, SubscriptionState] = {}
        self._changed: list[str] = []  # names changed since ``take_records``

    def get(self, name: str) -> SubscriptionState:
        try:
            return self._subs[name]
        except KeyError:
            raise SubscriptionNotFound(f"no subscription {name!r}") from None

    def all(self) -> list[SubscriptionState]:
        return [self._subs[name] for name in sorted(self._subs)]

    def commit(
        self,
        name: str,
        last_id: int | None,
        *,
        replica: bool | None,
        reset: bool,
        now: float,
        group: str | None = None,
        metadata: str | None = None,
    ) -> tuple[SubscriptionState, bool]:
        """Create or move a cursor; ``replica``, ``group`` and ``metadata`` None keep what it has.
        A commit that changes nothing writes no record."""
        if last_id is not None:
            check_cursor(last_id)  # int64, whichever way it came in (the original's is a uint64)
        if group is not None:
            check_group(group)
        if metadata is not None:
            check_metadata(metadata)
        current = self._subs.get(name)
        if current is not None and current.mode != CURSOR:
            raise WrongSubscriptionMode(
                f"subscription {name!r} is in ack mode: claim and ack its messages instead of committing"
            )
        if current is None:
            check_name(name, "subscription")
            sub = SubscriptionState(
                name, last_id or 0, bool(replica), now, now, group=group, metadata=metadata
            )
        else:
            new_last = current.last_id
            if last_id is not None and (reset or last_id > current.last_id):
                new_last = last_id
            new = (
                new_last,
                current.replica if replica is None else replica,
                current.group if group is None else group,
                current.metadata if metadata is None else metadata,
            )
            if new == (current.last_id, current.replica, current.group, current.metadata):
                return current, False
            sub = replace(current, last_id=new[0], replica=new[1], group=new[2], metadata=new[3], updated=now)
        self._subs[name] = sub
        self._changed.append(name)
        return sub, current is None

    def define_ack(self, name: str, policy: RetrySettings, *, now: float) -> tuple[SubscriptionState, bool]:
        """Create an ack-mode subscription, or change its policy; ``True`` when created."""
        current = self._subs.get(name)
        if current is None:
            check_name(name, "subscription")
            sub = SubscriptionState(name, 0, False, now, now, ACK, policy)
        elif current.mode != ACK:
            raise WrongSubscriptionMode(f"subscription {name!r} is a cursor; its mode cannot change")
        elif current.policy == policy:
            return current, False
        else:
            sub = replace(current, policy=policy, updated=now)
        self._subs[name] = sub
        self._changed.append(name)
        return sub, current is None

    def delete(self, name: str) -> None:
        self.get(name)
        del self._subs[name]
        self._changed.append(name)

    def replicas(self, message_id: int) -> list[str]:
        return [s.name for s in self.all() if s.replica and s.last_id >= message_id]

    def dump(self) -> bytes:
        return orjson.dumps({"version": 1, "subscriptions": {s.name: _fields(s) for s in self.all()}})

    def load(self, data: bytes) -> None:
        try:
            doc: dict[str, Any] = orjson.loads(data)
            self._subs = {name: _parsed(name, v) for name, v in doc["subscriptions"].items()}
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, InvalidRequest) as exc:
            raise CorruptData(f"subscriptions document is not valid: {exc}") from None

    def take_records(self) -> list[bytes]:
        """The change log records of the changes since the last call (``apply`` replays them)."""
        records = list(map(self._record, self._changed))
        self._changed.clear()
        return records

    def _record(self, name: str) -> bytes:
        """The record of ``name`` as it is now: its fields, or that it is gone."""
        sub = self._subs.get(name)
        if sub is None:
            return orjson.dumps({"name": name, "deleted": True})
        return orjson.dumps({"name": name, **_fields(sub)})

    def apply(self, record: bytes) -> None:
        """Replay a ``record``: the subscription it names becomes what it says."""
        try:
            change: dict[str, Any] = orjson.loads(record)
            name = str(change["name"])
            if change.get("deleted"):
                self._subs.pop(name, None)
            else:
                self._subs[name] = _parsed(name, change)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, InvalidRequest) as exc:
            raise CorruptData(f"subscription change record is not valid: {exc}") from None


def _fields(s: SubscriptionState) -> dict[str, Any]:
    return {
        "last_id": s.last_id,
        "replica": s.replica,
        "created": s.created,
        "updated": s.updated,
        **({"mode": s.mode, "policy": s.policy.to_dict()} if s.policy is not None else {}),
        **({"group": s.group} if s.group is not None else {}),
        **({"metadata": s.metadata} if s.metadata is not None else {}),
    }


def _parsed(name: str, v: dict[str, Any]) -> SubscriptionState:
    return SubscriptionState(
        name,
        int(v["last_id"]),
        bool(v["replica"]),
        float(v["created"]),
        float(v["updated"]),
        str(v.get("mode", CURSOR)),
        parse_policy(v["policy"], RetrySettings()) if v.get("mode") == ACK else None,
        _text(v.get("group")),
        _text(v.get("metadata")),
    )


def _text(value: object) -> str | None:
    # Absent (saved before these fields, or never set) is None; anything but text is corrupt.
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{value!r} is not text")
