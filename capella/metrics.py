"""Prometheus text (format 0.0.4) read from the cluster at scrape time.

Nothing here counts anything: queues and the cluster keep their own counters, and ``render``
only reads them, so a scrape costs a walk over the queues and nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from capella.core.cluster import Cluster
from capella.core.queue import Queue
from capella.core.stats import Histogram, ProtocolStats, SharedStats
from capella.handlers.base import find
from capella.handlers.supervisor import HandlerState
from capella.wire.postgres import PgOutboxStatus

if TYPE_CHECKING:
    # Only a type here: the push module is imported when a push handler exists.
    from capella.handlers.push import PushHandler

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_QUEUE_GAUGES = (
    ("capella_queue_messages", "Messages retained in the queue."),
    ("capella_queue_bytes", "Payload bytes retained in the queue."),
    ("capella_queue_last_id", "Highest id the queue has assigned."),
)
_QUEUE_COUNTERS = (
    ("capella_produced_messages_total", "Messages stored by produce requests.", "produced"),
    ("capella_duplicate_messages_total", "Produced messages answered as duplicates.", "duplicates"),
    ("capella_read_messages_total", "Messages returned by reads.", "read"),
    ("capella_produce_requests_total", "Produce requests.", "produce_requests"),
    ("capella_read_requests_total", "Read requests.", "read_requests"),
)


def render(cluster: Cluster, handlers: Sequence[HandlerState] = ()) -> str:
    """Every Capella metric as Prometheus text, ending with a newline."""
    queues = cluster.queues() if cluster.ready else []
    stats = [(q, q.stats()) for q in queues]
    out: list[str] = []

    gauge_values = {
        "capella_queue_messages": [(q.name, s.get("messages", 0)) for q, s in stats],
        "capella_queue_bytes": [(q.name, s.get("bytes", 0)) for q, s in stats],
        "capella_queue_last_id": [(q.name, q.last_id) for q, _ in stats],
    }
    for name, help_text in _QUEUE_GAUGES:
        _header(out, name, help_text, "gauge")
        out.extend(f'{name}{{queue="{escape(q)}"}} {_num(v)}' for q, v in gauge_values[name])

    _header(out, "capella_queue_blocks", "Blocks of the queue by state.", "gauge")
    for q, s in stats:
        by_state = s.get("blocks", {}).get("by_state", {})
        for state, count in sorted(by_state.items()):
            out.append(
                f'capella_queue_blocks{{queue="{escape(q.name)}",state="{escape(state)}"}} {_num(count)}'
            )

    for name, help_text, attr in _QUEUE_COUNTERS:
        _header(out, name, help_text, "counter")
        out.extend(f'{name}{{queue="{escape(q.name)}"}} {_num(getattr(q.counters, attr))}' for q in queues)

    lag_lines: list[str] = []
    cursor_lines: list[str] = []
    for q in queues:
        for sub in q.subscriptions():
            labels = (
                f'queue="{escape(q.name)}",subscription="{escape(sub.name)}",'
                f'replica="{"true" if sub.replica else "false"}"'
            )
            lag_lines.append(f"capella_subscription_lag{{{labels}}} {max(0, q.last_id - sub.last_id)}")
            cursor_lines.append(f"capella_subscription_last_id{{{labels}}} {sub.last_id}")
    _header(out, "capella_subscription_lag", "Messages after a subscription's cursor.", "gauge")
    out.extend(lag_lines)
    _header(out, "capella_subscription_last_id", "A subscription's cursor.", "gauge")
    out.extend(cursor_lines)

    _header(
        out,
        "capella_queue_writable",
        "1 when the queue accepts writes, 0 when a storage fault stops them.",
        "gauge",
    )
    out.extend(f'capella_queue_writable{{queue="{escape(q.name)}"}} {0 if q.faults else 1}' for q in queues)

    _header(
        out,
        "capella_task_failures_total",
        "Failed runs of background tasks (each is retried after a backoff).",
        "counter",
    )
    for task, count in sorted(cluster.task_failures.counts.items()):
        out.append(f'capella_task_failures_total{{task="{escape(task)}"}} {count}')

    local = cluster.local_queues() if cluster.ready else []
    _schedule_metrics(out, local)
    _work_metrics(out, local)
    _handler_metrics(out, handlers)
    _push_metrics(out, handlers)

    _header(out, "capella_flush_seconds", "Time to save and fsync one flush.", "histogram")
    _histogram(out, "capella_flush_seconds", "", cluster.flush_latency)
    if cluster.shared is not None:
        _shared_metrics(out, cluster.shared.stats)
    for door, door_stats in sorted(cluster.doors.items()):
        _door_metrics(out, door, door_stats)
    out.append("")
    return "\n".join(out)


_SHARED_COUNTERS = (
    ("capella_shared_flushes_total", "Flushes of this node's shared-queue buffer.", "flushes"),
    ("capella_shared_objects_total", "Objects this node wrote to S3 and committed.", "objects"),
    ("capella_shared_put_requests_total", "PUT requests to S3 (flushes and compaction).", "puts"),
    ("capella_shared_put_bytes_total", "Bytes PUT to S3.", "put_bytes"),
    ("capella_shared_get_requests_total", "GET requests to S3 (reads and compaction).", "gets"),
    ("capella_shared_get_bytes_total", "Bytes read from S3.", "get_bytes"),
    ("capella_shared_duplicates_total", "Messages a commit found stored already.", "duplicates"),
    ("capella_shared_compactions_total", "Compaction runs that wrote a block.", "compactions"),
    ("capella_shared_compacted_objects_total", "Source objects of compacted blocks.", "compacted_objects"),
    ("capella_shared_garbage_objects_total", "Objects the janitor deleted.", "garbage_objects"),
    ("capella_shared_notifications_total", "Commit notifications received from PostgreSQL.", "notifications"),
)


def _shared_metrics(out: list[str], stats: SharedStats) -> None:
    for name, text, attribute in _SHARED_COUNTERS:
        _header(out, name, text, "counter")
        out.append(f"{name} {getattr(stats, attribute)}")
    _header(out, "capella_shared_failures_total", "Failed shared-queue steps (each retried).", "counter")
    for step, count in sorted(stats.failures.items()):
        out.append(f'capella_shared_failures_total{{step="{escape(step)}"}} {count}')
    _header(out, "capella_shared_flush_seconds", "Time from a flush's start to its commit.", "histogram")
    _histogram(out, "capella_shared_flush_seconds", "", stats.flush_seconds)
    _header(out, "capella_shared_commit_seconds", "Time of one commit transaction.", "histogram")
    _histogram(out, "capella_shared_commit_seconds", "", stats.commit_seconds)


_DOOR_COUNTERS = (
    ("capella_protocol_connections_total", "Connections accepted by a front door.", "connections"),
    (
        "capella_protocol_refused_connections_total",
        "Connections refused over the limit.",
        "refused_connections",
    ),
    ("capella_protocol_closed_by_error_total", "Connections closed for a bad frame.", "closed_by_error"),
    ("capella_protocol_sign_in_failures_total", "Refused sign-ins.", "sign_in_failures"),
)


def _door_metrics(out: list[str], door: str, stats: ProtocolStats) -> None:
    label = f'protocol="{escape(door)}"'
    for name, help_text, attr in _DOOR_COUNTERS:
        _header(out, name, help_text, "counter")
        out.append(f"{name}{{{label}}} {getattr(stats, attr)}")
    _header(out, "capella_protocol_open_connections", "Connections open now.", "gauge")
    out.append(f"capella_protocol_open_connections{{{label}}} {stats.open_connections}")
    _header(out, "capella_protocol_requests_total", "Requests by API.", "counter")
    for api, count in sorted(stats.requests.items()):
        out.append(f'capella_protocol_requests_total{{{label},api="{escape(api)}"}} {count}')
    _header(out, "capella_protocol_errors_total", "Error codes answered, by API and code.", "counter")
    for (api, code), count in sorted(stats.errors.items()):
        out.append(f'capella_protocol_errors_total{{{label},api="{escape(api)}",code="{code}"}} {count}')


def _histogram(out: list[str], name: str, labels: str, hist: Histogram) -> None:
    cumulative = 0
    sep = "," if labels else ""
    # Histogram.counts are per bucket; Prometheus buckets count everything at or below ``le``.
    for bound, count in zip(hist.bounds, hist.counts, strict=False):
        cumulative += count
        out.append(f'{name}_bucket{{{labels}{sep}le="{_num(float(bound))}"}} {cumulative}')
    total = sum(hist.counts)
    out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {total}')
    braces = f"{{{labels}}}" if labels else ""
    out.append(f"{name}_sum{braces} {_num(float(hist.sum))}")
    out.append(f"{name}_count{braces} {total}")


_SCHEDULE_COUNTERS = (
    ("capella_scheduled_total", "Delayed messages scheduled.", "scheduled"),
    ("capella_released_total", "Delayed messages delivered into the log when due.", "released"),
    (
        "capella_released_duplicates_total",
        "Delayed messages whose identity was already in the log when due (not stored again).",
        "released_duplicates",
    ),
    ("capella_scheduled_cancelled_total", "Delayed messages cancelled.", "cancelled"),
    ("capella_rescheduled_total", "Delayed messages moved to another time.", "rescheduled"),
)
_WORK_COUNTERS = (
    ("capella_work_claimed_total", "Messages handed out by claims (retries included).", "claimed"),
    ("capella_work_redelivered_total", "Claims of a message that was claimed before.", "redelivered"),
    ("capella_work_acked_total", "Claimed messages acked.", "acked"),
    ("capella_work_nacked_total", "Claimed messages given back with an error.", "nacked"),
    ("capella_work_expired_total", "Leases that ran out (counted as failures).", "expired"),
    ("capella_work_dead_lettered_total", "Messages that used up their attempts.", "dead_lettered"),
    ("capella_work_moved_back_total", "Dead messages moved back by an operator.", "moved_back"),
    ("capella_work_deleted_total", "Messages an operator finished without processing.", "deleted"),
)


def _schedule_metrics(out: list[str], queues: list[Queue]) -> None:
    _header(out, "capella_scheduled_messages", "Delayed messages waiting for their time.", "gauge")
    out.extend(f'capella_scheduled_messages{{queue="{escape(q.name)}"}} {q.schedule.count}' for q in queues)
    _header(out, "capella_scheduled_in_memory", "Delayed messages held in memory (due soon).", "gauge")
    out.extend(
        f'capella_scheduled_in_memory{{queue="{escape(q.name)}"}} {q.schedule.in_memory}' for q in queues
    )
    _header(
        out,
        "capella_scheduled_overdue_seconds",
        "How long the earliest delayed message has been due without being delivered (0 when none).",
        "gauge",
    )
    for q in queues:
        due = q.schedule.next_due()
        late = 0.0 if due is None else max(0.0, q.now() - due)
        out.append(f'capella_scheduled_overdue_seconds{{queue="{escape(q.name)}"}} {_num(late)}')
    for name, help_text, attr in _SCHEDULE_COUNTERS:
        _header(out, name, help_text, "counter")
        out.extend(
            f'{name}{{queue="{escape(q.name)}"}} {_num(getattr(q.schedule.counters, attr))}' for q in queues
        )


def _work_metrics(out: list[str], queues: list[Queue]) -> None:
    works = [
        (f'queue="{escape(q.name)}",subscription="{escape(w.name)}"', q, w)
        for q in queues
        for w in q.work_queues()
    ]
    _header(out, "capella_work_messages", "Messages of an ack-mode subscription by state.", "gauge")
    for labels, _, w in works:
        state = w.state
        for name, count in (
            ("in_flight", state.count("in_flight")),
            ("failed", state.count("failed")),
            ("dead", len(state.dead)),
        ):
            out.append(f'capella_work_messages{{{labels},state="{name}"}} {count}')
    _header(out, "capella_work_backlog", "Message ids after the highest one ever claimed.", "gauge")
    out.extend(
        f"capella_work_backlog{{{labels}}} {max(0, q.last_id - w.state.high)}" for labels, q, w in works
    )
    for name, help_text, attr in _WORK_COUNTERS:
        _header(out, name, help_text, "counter")
        out.extend(f"{name}{{{labels}}} {_num(getattr(w.counters, attr))}" for labels, _, w in works)


def _handler_metrics(out: list[str], handlers: Sequence[HandlerState]) -> None:
    rows = [
        (h, f'handler="{escape(h.name)}",type="{escape(h.type)}"', h.status().added(h.type)) for h in handlers
    ]
    _header(
        out,
        "capella_handler_items_total",
        "Items a handler's passes handled (pg handlers: rows or messages relayed).",
        "counter",
    )
    out.extend(f"capella_handler_items_total{{{labels}}} {h.items}" for h, labels, _ in rows)
    _header(out, "capella_handler_error", "1 while a handler's last pass failed.", "gauge")
    out.extend(
        f"capella_handler_error{{{labels}}} {0 if h.last_error is None else 1}" for h, labels, _ in rows
    )
    _header(
        out,
        "capella_handler_lag",
        "Work a handler has not done yet: messages past its cursors (copy, pg_inbox), rows waiting "
        "in the outbox table (pg_outbox).",
        "gauge",
    )
    out.extend(
        f"capella_handler_lag{{{labels}}} {_num(added.lag)}"
        for _, labels, added in rows
        if added is not None and isinstance(added.lag, int | float)
    )
    _header(out, "capella_handler_oldest_age_seconds", "pg_outbox: age of the oldest waiting row.", "gauge")
    out.extend(
        f"capella_handler_oldest_age_seconds{{{labels}}} {_num(added.oldest_age)}"
        for _, labels, added in rows
        if isinstance(added, PgOutboxStatus) and isinstance(added.oldest_age, int | float)
    )


_PUSH_COUNTERS = (
    (
        "capella_push_delivered_total",
        "Messages a push handler delivered (acked by the receiver).",
        "delivered",
    ),
    ("capella_push_delivered_bytes_total", "Payload bytes a push handler delivered.", "delivered_bytes"),
    ("capella_push_failed_total", "Failed delivery attempts (messages).", "failed"),
    ("capella_push_dead_total", "Messages a push handler gave up on (dead letters).", "dead"),
)


def _push_metrics(out: list[str], handlers: Sequence[HandlerState]) -> None:
    pushes = [
        (f'handler="{escape(s.name)}",queue="{escape(h.queue)}"', h)
        for s in handlers
        if s.handler.loaded and _delivers(s.type)
        for h in (cast("PushHandler", s.handler),)
    ]
    for name, help_text, attr in _PUSH_COUNTERS:
        _header(out, name, help_text, "counter")
        out.extend(f"{name}{{{labels}}} {getattr(h.counters, attr)}" for labels, h in pushes)
    _header(
        out,
        "capella_push_requests_total",
        "Push requests by outcome (2xx, 4xx, 5xx, timeout, ...).",
        "counter",
    )
    for labels, h in pushes:
        for outcome, count in sorted(h.counters.requests.items()):
            out.append(f'capella_push_requests_total{{{labels},outcome="{escape(outcome)}"}} {count}')
    _header(out, "capella_push_in_flight", "Messages in push requests now.", "gauge")
    out.extend(f"capella_push_in_flight{{{labels}}} {h.in_flight}" for labels, h in pushes)
    _header(out, "capella_push_lag", "Messages a push handler has not delivered yet.", "gauge")
    out.extend(f"capella_push_lag{{{labels}}} {h.lag()}" for labels, h in pushes)
    name = "capella_push_delivery_seconds"
    _header(out, name, "From the append to the acked delivery of a pushed message.", "histogram")
    for labels, h in pushes:
        _histogram(out, name, labels, h.latency)


def _delivers(kind: str) -> bool:
    """Whether handlers of type ``kind`` report deliveries (the push metrics)."""
    entry = find(kind)
    return entry is not None and entry.delivers


def escape(value: str) -> str:
    """A label value with backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _header(out: list[str], name: str, help_text: str, kind: str) -> None:
    out.append(f"# HELP {name} {help_text}")
    out.append(f"# TYPE {name} {kind}")


def _num(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    return str(value)
