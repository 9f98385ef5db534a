#!/usr/bin/env bash
# A shared cluster on this machine, as the tests start one: a throwaway PostgreSQL (Debian's
# initdb/pg_ctl, fsync and synchronous_commit on), moto's S3 server, and three `capella serve`
# nodes on 127.0.0.1:8681-8683 with the same [cluster] name, one bucket and one database.
#
#   deploy/shared-local.sh start DIR    # a new, empty cluster under DIR, in the background; prints the node URLs
#   deploy/shared-local.sh stop DIR     # stops the nodes, moto and PostgreSQL
#
# Needs `make tools` (PostgreSQL) and the virtualenv `make run` builds (.venv: capella, moto, boto3).
# For a look at the model only: nothing here is for production (docs/shared.md, "Running it").
set -euo pipefail

ACTION=${1:?usage: $0 start|stop DIR}
DIR=$(realpath -m "${2:?usage: $0 start|stop DIR}")
HERE=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
PG_PORT=${PG_PORT:-8690}
S3_PORT=${S3_PORT:-8691}
NODES=(8681 8682 8683)
PGBIN=$(dirname "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")
AS=()
[ "$(id -u)" = 0 ] && AS=(runuser -u postgres --)

wait_for() {  # URL: until it answers, at most 30 s
    for _ in $(seq 300); do
        "$PY" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "no answer from $1" >&2
    return 1
}

start() {
    stop  # whatever an earlier start left running in DIR: each start is a new, empty cluster
    rm -rf "$DIR"
    mkdir -p "$DIR"
    cd /  # PostgreSQL's tools run as the postgres user, who may not enter the current directory
    # PostgreSQL: its own cluster, only on 127.0.0.1, durable as shared queues need it.
    mkdir -p "$DIR/pg"
    if [ ${#AS[@]} -gt 0 ]; then chown postgres "$DIR/pg"; fi
    "${AS[@]}" "$PGBIN/initdb" -D "$DIR/pg/data" -U postgres -A trust >/dev/null
    printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nfsync = on\nsynchronous_commit = on\n" \
        "$PG_PORT" "$DIR/pg" | "${AS[@]}" tee -a "$DIR/pg/data/postgresql.auto.conf" >/dev/null
    "${AS[@]}" "$PGBIN/pg_ctl" -D "$DIR/pg/data" -l "$DIR/pg/log" -w start >/dev/null
    # moto's S3 server keeps objects in memory: stopping it loses them (fine for a look).
    nohup "$PY" -m moto.server -H 127.0.0.1 -p "$S3_PORT" >"$DIR/moto.log" 2>&1 &
    echo $! >"$DIR/moto.pid"
    wait_for "http://127.0.0.1:$S3_PORT/moto-api/"
    "$PY" - "$S3_PORT" <<'EOF'
import sys

import boto3

s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", region_name="us-east-1",
                  aws_access_key_id="local", aws_secret_access_key="local")
if "capella" not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
    s3.create_bucket(Bucket="capella")
EOF
    for i in "${!NODES[@]}"; do
        cat >"$DIR/node-$i.toml" <<EOF
[cluster]
name = "shared-local"
data_dir = "node-$i"

[mounts.default]
provider = "file"
path = "queues"

[mounts.s3main]
provider = "s3"
bucket = "capella"
endpoint_url = "http://127.0.0.1:$S3_PORT"
region = "us-east-1"
access_key_id = "local"
secret_access_key = "local"

[shared]
node = "node-$i"
mount = "s3main"
dsn = "postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
EOF
        nohup "$HERE/.venv/bin/capella" serve --config "$DIR/node-$i.toml" --listen "127.0.0.1:${NODES[$i]}" \
            >"$DIR/node-$i.log" 2>&1 &
        echo $! >"$DIR/node-$i.pid"
    done
    for port in "${NODES[@]}"; do
        wait_for "http://127.0.0.1:$port/readyz"
        echo "http://127.0.0.1:$port"
    done
}

stop() {
    cd /
    for pid in "$DIR"/node-*.pid "$DIR/moto.pid"; do
        [ -f "$pid" ] || continue
        kill "$(cat "$pid")" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$(cat "$pid")" 2>/dev/null || break; sleep 0.1; done
        rm -f "$pid"
    done
    if [ -f "$DIR/pg/data/postmaster.pid" ]; then
        "${AS[@]}" "$PGBIN/pg_ctl" -D "$DIR/pg/data" -m fast -w stop >/dev/null
    fi
}

case "$ACTION" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
