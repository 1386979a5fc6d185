#!/usr/bin/env bash
# Runs every benchmark in a quick mode (a few seconds each, tiny inputs, one
# round, charts to a scratch directory): it proves the benches still build and
# run end to end against PostgreSQL and the broker. No figure is asserted and
# none of this output is a measurement; BENCHMARKS.md says how to measure.
#
#   scripts/services.sh up && scripts/bench-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."

charts=$(mktemp -d)
trap 'rm -rf "$charts"' EXIT
export BENCH_CHARTS_DIR="$charts"

# `run NAME [VAR=value ...]` runs bench NAME with those settings. One build
# serves every bench and the README's test command: the dev profile and the
# features of the whole workspace (those `cargo test --workspace` builds
# with, and they include every bench's required features), so after the
# tests only the bench binaries compile. A measurement uses the release
# profile (`cargo bench -p ...`, BENCHMARKS.md).
run() {
    local name=$1
    shift
    printf '\n--- bench %s (quick mode)\n' "$name"
    local started=$SECONDS
    env "$@" cargo bench --workspace --profile dev --bench "$name"
    printf -- '--- bench %s: ok in %d s\n' "$name" $((SECONDS - started))
}

run handler BENCH_ITERATIONS=50 BENCH_ROUNDS=1
run handler_sea_orm BENCH_ITERATIONS=50 BENCH_ROUNDS=1
run handler_mysql BENCH_ITERATIONS=50 BENCH_ROUNDS=1
run consumer OUTBOX_BENCH_EVENTS=2000 OUTBOX_BENCH_ROUNDS=1 OUTBOX_BENCH_BASELINE_EVENTS=500
run inbox_claim OUTBOX_BENCH_PENDING=2000 OUTBOX_BENCH_ROUNDS=1
run consumer_store STORE_BENCH_BATCHES=200 STORE_BENCH_ROUNDS=1
run relay RELAY_BENCH_EVENTS=2000 RELAY_BENCH_BASELINE_EVENTS=100 RELAY_BENCH_PUBLISHED_ROWS=5000 \
    RELAY_BENCH_LATENCY_SECS=1 RELAY_BENCH_LATENCY_ROUNDS=1 RELAY_BENCH_ROUNDS=1 \
    RELAY_BENCH_PARKED_ROWS=5000 RELAY_BENCH_PARKED_EVENTS=2000
run relay_mysql MYSQL_BENCH_EVENTS=2000 MYSQL_BENCH_BASELINE_EVENTS=100 MYSQL_BENCH_PUBLISHED_ROWS=5000 MYSQL_BENCH_PARKED_ROWS=5000 \
    MYSQL_BENCH_ROUNDS=1
run consumer_mysql CONSUMER_MYSQL_EVENTS=2000 CONSUMER_MYSQL_ROUNDS=1 CONSUMER_MYSQL_BASELINE_EVENTS=200
run hops HOPS_BENCH_MODES=dedup,inbox,saga,bare HOPS_BENCH_CHAINS=1 HOPS_BENCH_RATES=100 \
    HOPS_BENCH_ROUNDS=1 HOPS_BENCH_SECS=1
run capacity CAPACITY_EVENTS=500 CAPACITY_BACKLOG=2000 CAPACITY_RELAYS=1,2
run scheduled SCHEDULED_BENCH_MESSAGES=100 SCHEDULED_BENCH_SPREAD_MS=500 SCHEDULED_BENCH_ROUNDS=1 \
    SCHEDULED_BENCH_DRAIN=2000 SCHEDULED_BENCH_FUTURE=5000
run saga SAGA_BENCH_STEPS=400 SAGA_BENCH_SAGAS=40 SAGA_BENCH_ROUNDS=1
# The seed's own Python relay as a baseline (skipped if Python is missing).
scripts/seed-baseline.sh >/dev/null || true
run seed_python SEED_ROUNDS=1 SEED_EVENTS=200 SEED_RELAY_EVENTS=1000
