#!/usr/bin/env bash
# `palisade lock run`: run a job while holding a lock, with its token in FENCING_TOKEN.
#
#   examples/lock_run.sh http://127.0.0.1:8080 http://127.0.0.1:8081
#
# The first argument is a lock service in dev mode (`palisade serve --insecure-dev-identity`
# with examples/authz.toml and a class `orders/invoices` for keys starting `invoice-`, as
# the README's first steps set up), the second a fenced service such as
# examples/protected_service.rs. The job below runs only once the lock is held; if the hold
# is lost (session expired, lock service unreachable for a TTL) `lock run` kills it and
# exits with 76. Exit 75 means the lock was not acquired in time.
#
# Against a service on mTLS, name the SVID instead of --dev-identity (or export
# PALISADE_CERT, PALISADE_KEY and PALISADE_CA): --cert svid.pem --key svid.key --ca ca.pem
set -euo pipefail
service=${1:?lock service URL}
target=${2:?protected service URL}

palisade lock run orders/invoices/invoice-42 \
    --service "$service" --dev-identity spiffe://example.org/orders/nightly --ttl 10 --wait-ms 5000 \
    -- sh -c '
        echo "holding orders/invoices/invoice-42 with token $FENCING_TOKEN"
        # Send the token with every write; a stale token gets 409 Conflict.
        curl -fsS -X PUT -H "Fencing-Token: $FENCING_TOKEN" -H "x-caller: spiffe://example.org/orders/nightly" \
            --data "closed by the nightly job" "$0/orders/invoice-42"
    ' "$target"
