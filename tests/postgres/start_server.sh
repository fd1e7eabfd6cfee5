#!/usr/bin/env bash
# A PostgreSQL server on this machine for tests/test_postgres.py: the README's shared study storage, tried for
# real (two `tune` workers on one study, a worker killed mid-trial, the server stopped mid-study). CI runs it
# before the tests; the tests skip without it, saying why.
#
#   sudo tests/postgres/start_server.sh          # Debian/Ubuntu: installs postgresql first if missing
#   sudo tests/postgres/start_server.sh stop     # stops it (the tests stop and restart it themselves)
#
# The server runs as the `postgres` user from a cluster in $PGTEST_DIR, on 127.0.0.1:$PGTEST_PORT only, with
# password authentication over TCP; it has a role `tuner` (password $PGTEST_PASSWORD) owning a database
# `studies`. A second call with the server up does nothing.
set -euo pipefail

PORT=${PGTEST_PORT:-54329}
DIR=${PGTEST_DIR:-/tmp/project-test-postgres}
PASSWORD=${PGTEST_PASSWORD:-tuner-test-password}

bin_dir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
as_postgres() { runuser -u postgres -- "$@"; }

if [[ $(id -u) != 0 ]]; then
    echo "error: starting the test PostgreSQL server needs root (it runs as the postgres user): sudo $0" >&2
    exit 1
fi
if [[ -z $(bin_dir) ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq postgresql >/dev/null || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }
fi
BIN=$(bin_dir)

if [[ ${1:-start} == stop ]]; then
    [[ -f $DIR/data/postmaster.pid ]] && as_postgres "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null
    exit 0
fi
if "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
    exit 0  # already running
fi
if [[ ! -f $DIR/data/PG_VERSION ]]; then
    rm -rf "$DIR"
    mkdir -p "$DIR"
    chown postgres:postgres "$DIR"
    as_postgres "$BIN/initdb" -D "$DIR/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    NEW=1
fi
as_postgres "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
    -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1" start >/dev/null
if [[ ${NEW:-} == 1 ]]; then
    as_postgres "$BIN/psql" -q -h "$DIR" -p "$PORT" -U postgres \
        -c "CREATE ROLE tuner LOGIN PASSWORD '$PASSWORD'" -c "CREATE DATABASE studies OWNER tuner" >/dev/null
fi
echo "PostgreSQL up: postgresql://tuner:***@127.0.0.1:$PORT/studies"
