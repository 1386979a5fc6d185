#!/usr/bin/env bash
# Installs what the seed's own Python relay needs (SQLAlchemy, asyncpg,
# aiokafka) into a virtualenv under the user's cache, for the seed_python
# bench, and prints the interpreter's path. Needs python3 with venv; without
# it, says so and exits 1 (the bench then skips the Python baseline).
#
#   scripts/seed-baseline.sh && cargo bench -p txoutbox-runtime --bench seed_python
set -euo pipefail

venv="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-dev/seed-venv"
if ! command -v python3 >/dev/null || ! python3 -m venv --help >/dev/null 2>&1; then
    echo "[seed-baseline] python3 with venv is missing: the Python baseline cannot run" >&2
    exit 1
fi
if ! "$venv/bin/python" -c 'import aiokafka, asyncpg, sqlalchemy' 2>/dev/null; then
    echo "[seed-baseline] installing SQLAlchemy, asyncpg and aiokafka into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        'sqlalchemy[asyncio]>=2,<3' 'asyncpg>=0.29' 'aiokafka>=0.10'
fi
echo "$venv/bin/python"
