#!/bin/sh
# Wires the brokers of docker/compose.yaml together: the queue, the `replicator` users the
# external clusters sign in with, the external clusters and the copy handlers (edge -> dc1,
# dc1 <-> dc2). It only uses the `capella` CLI, and it can run again: every step creates or replaces.
#
# compose.yaml runs it once as the `setup` service; by hand it needs the variables of
# capella.env.example and the brokers' URLs (DC1_URL, DC2_URL, EDGE_URL).
set -eu

DC1_URL=${DC1_URL:-http://dc1:8676}
DC2_URL=${DC2_URL:-http://dc2:8676}
EDGE_URL=${EDGE_URL:-http://edge:8676}
QUEUE=telemetry

# on URL ADMIN_PASSWORD capella-arguments...: a command as that broker's admin.
on() {
    url=$1 password=$2
    shift 2
    CAPELLA_URL=$url CAPELLA_USER=admin CAPELLA_PASSWORD=$password capella "$@"
}

# wait URL ADMIN_PASSWORD: until the broker answers its admin (at most a minute).
wait_for() {
    tries=0
    until on "$1" "$2" queue list >/dev/null 2>&1; do
        tries=$((tries + 1))
        [ "$tries" -lt 60 ] || { echo "setup: $1 does not answer" >&2; exit 1; }
        sleep 1
    done
}

# replicator URL ADMIN_PASSWORD REPLICATOR_PASSWORD: the user other clusters sign in
# with; it may read and write the replicated queue and nothing else.
replicator() {
    if on "$1" "$2" user show replicator >/dev/null 2>&1; then
        printf '%s\n' "$3" | on "$1" "$2" user passwd replicator --password-stdin
    else
        printf '%s\n' "$3" | on "$1" "$2" user add replicator --password-stdin \
            --allow "queue:read:$QUEUE" --allow "queue:write:$QUEUE"
    fi
}

wait_for "$DC1_URL" "$DC1_ADMIN_PASSWORD"
wait_for "$DC2_URL" "$DC2_ADMIN_PASSWORD"
wait_for "$EDGE_URL" "$EDGE_ADMIN_PASSWORD"

for broker in "$DC1_URL $DC1_ADMIN_PASSWORD" "$DC2_URL $DC2_ADMIN_PASSWORD" "$EDGE_URL $EDGE_ADMIN_PASSWORD"; do
    # shellcheck disable=SC2086 # a URL and a password, split on purpose
    on $broker queue create "$QUEUE" --save wait
done
replicator "$DC1_URL" "$DC1_ADMIN_PASSWORD" "$DC1_REPLICATOR_PASSWORD"
replicator "$DC2_URL" "$DC2_ADMIN_PASSWORD" "$DC2_REPLICATOR_PASSWORD"

# The edge uploads to dc1.
on "$EDGE_URL" "$EDGE_ADMIN_PASSWORD" cluster add dc1 --url "$DC1_URL" \
    --username replicator --password-secret dc1-replicator
on "$EDGE_URL" "$EDGE_ADMIN_PASSWORD" cluster ping dc1
on "$EDGE_URL" "$EDGE_ADMIN_PASSWORD" handler create up --type copy --queue "$QUEUE" --param "to=dc1/$QUEUE"

# dc1 and dc2 copy into each other; what comes back is recognised by its identity.
on "$DC1_URL" "$DC1_ADMIN_PASSWORD" cluster add dc2 --url "$DC2_URL" \
    --username replicator --password-secret dc2-replicator
on "$DC1_URL" "$DC1_ADMIN_PASSWORD" cluster ping dc2
on "$DC1_URL" "$DC1_ADMIN_PASSWORD" handler create to-dc2 --type copy --queue "$QUEUE" --param "to=dc2/$QUEUE"
on "$DC2_URL" "$DC2_ADMIN_PASSWORD" cluster add dc1 --url "$DC1_URL" \
    --username replicator --password-secret dc1-replicator
on "$DC2_URL" "$DC2_ADMIN_PASSWORD" cluster ping dc1
on "$DC2_URL" "$DC2_ADMIN_PASSWORD" handler create to-dc1 --type copy --queue "$QUEUE" --param "to=dc1/$QUEUE"

echo "setup: edge -> dc1 <-> dc2 wired for queue $QUEUE"
