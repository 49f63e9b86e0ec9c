#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for the tests.
#
# Sourced (`source scripts/pg.sh; pg_start`): starts the cluster, exports
# TASKGATE_TEST_PG_URL and installs an EXIT trap that stops it and removes its
# directory. Run directly (`bash scripts/pg.sh run CMD ARGS…`): the same around one
# command, e.g. `bash scripts/pg.sh run cargo nextest run --release --features external-tests --lib -E 'test(/postgres/)'`.
#
# The cluster: Debian's PostgreSQL 15 binaries (package `postgresql`, installed if
# absent), `initdb --no-sync -A trust` into a fresh temp directory, run as the
# `postgres` OS user when we are root (initdb refuses root), listening on 127.0.0.1 at
# a free port with its unix socket in that directory. fsync stays on: the tests measure
# and rely on the same durability as production. Tests isolate themselves by schema.
#
# TLS only over TCP (README "TLS", "PostgreSQL"): a throwaway CA and a server
# certificate for `localhost` and 127.0.0.1 are minted into that directory per run
# (`openssl`, package `openssl`, installed if absent), `ssl = on`, and pg_hba.conf
# accepts TCP connections with `hostssl` only (the unix socket stays `local`, for
# pg_ctl). TASKGATE_TEST_PG_URL says `sslmode=verify-full` with that CA as
# `sslrootcert`, so every PostgreSQL test runs over verified TLS; TASKGATE_TEST_PG_CA
# is the CA file.
#
# TASKGATE_PG_SERVER_OPTIONS adds server settings for experiments, e.g.
# `TASKGATE_PG_SERVER_OPTIONS="-c shared_buffers=2GB" bash scripts/pg.sh run …`
# (benches/RESULTS.md measures the 1M-task schema with the default and a larger cache).

PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"

pg__as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

pg__free_port() {
    local port lo
    # Below the kernel's ephemeral range, so no outgoing connection of a running test
    # takes the port between this check and the bind.
    lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    for _ in $(seq 1 50); do
        port=$((10000 + RANDOM % (lo - 10000)))
        # Nothing answers on it (bash's /dev/tcp connect fails) → free enough.
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return 0
        fi
    done
    echo "no free port found" >&2
    return 1
}

pg_install() {
    if ! command -v openssl >/dev/null 2>&1; then
        echo "== installing openssl (Debian package openssl: the test cluster's certificates)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
    fi
    if [ -x "$PG_BIN/initdb" ] && [ -x "$PG_BIN/pg_ctl" ]; then
        return 0
    fi
    echo "== installing PostgreSQL 15 (Debian package postgresql)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
}

# A CA (`$1/ca.pem`) and a server certificate it signed for localhost and 127.0.0.1
# (`$1/server.pem`, key `$1/server-key.pem`, owned by the cluster's owner, mode 0600:
# PostgreSQL refuses a key others can read).
pg__mint_certs() {
    local d=$1
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj "/CN=taskgate test PostgreSQL CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$d/ca-key.pem" -out "$d/ca.pem" >"$d/openssl.log" 2>&1 || return 1
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -subj "/CN=localhost" -keyout "$d/server-key.pem" -out "$d/server.csr" \
        >>"$d/openssl.log" 2>&1 || return 1
    printf '%s\n' "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" \
        "subjectAltName=DNS:localhost,IP:127.0.0.1" >"$d/server.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca-key.pem" \
        -CAcreateserial -days 2 -extfile "$d/server.ext" -out "$d/server.pem" \
        >>"$d/openssl.log" 2>&1 || return 1
    rm -f "$d/ca-key.pem" "$d/server.csr" "$d/server.ext" "$d/ca.srl"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$d/server.pem" "$d/server-key.pem"
    fi
    chmod 600 "$d/server-key.pem"
    chmod 644 "$d/ca.pem" "$d/server.pem"
}

pg_stop() {
    if [ -n "${PG_TEST_DIR:-}" ] && [ -d "$PG_TEST_DIR" ]; then
        pg__as_owner "$PG_BIN/pg_ctl" -D "$PG_TEST_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
        rm -rf "$PG_TEST_DIR"
    fi
    PG_TEST_DIR=""
}

pg_start() {
    pg_install
    local t0 port
    t0=$(date +%s%N)
    PG_TEST_DIR=$(mktemp -d /tmp/taskgate-pg.XXXXXX)
    trap pg_stop EXIT
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$PG_TEST_DIR"
    fi
    chmod 700 "$PG_TEST_DIR"
    pg__as_owner "$PG_BIN/initdb" -D "$PG_TEST_DIR/data" --no-sync -A trust -U postgres \
        -E UTF8 --locale=C >"$PG_TEST_DIR/initdb.log" 2>&1 || {
        cat "$PG_TEST_DIR/initdb.log" >&2
        return 1
    }
    pg__mint_certs "$PG_TEST_DIR" || {
        cat "$PG_TEST_DIR/openssl.log" >&2
        return 1
    }
    # TCP only with TLS; `local` (the unix socket) for pg_ctl's readiness check. The
    # role `taskgate_scram` (created by tests/pg_tls.rs) logs in with SCRAM, the only
    # password check there (first matching line wins).
    printf '%s\n' "local all all trust" \
        "hostssl all taskgate_scram 127.0.0.1/32 scram-sha-256" \
        "hostssl all all 127.0.0.1/32 trust" \
        "hostssl all all ::1/128 trust" >"$PG_TEST_DIR/data/pg_hba.conf"
    # The port can still be taken before the bind: try a few.
    local attempt started=""
    for attempt in 1 2 3 4 5; do
        port=$(pg__free_port)
        # max_connections: every test opens its own pool (default 16 connections).
        # pg_stat_statements: the benchmarks count statements per task (benches/RESULTS.md).
        if pg__as_owner "$PG_BIN/pg_ctl" -D "$PG_TEST_DIR/data" -w -t 30 \
            -l "$PG_TEST_DIR/server.log" \
            -o "-c listen_addresses=127.0.0.1 -p $port -k $PG_TEST_DIR -c max_connections=400 \
                -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all \
                -c ssl=on -c ssl_cert_file=$PG_TEST_DIR/server.pem \
                -c ssl_key_file=$PG_TEST_DIR/server-key.pem ${TASKGATE_PG_SERVER_OPTIONS:-}" \
            start >/dev/null; then
            started=1
            break
        fi
        echo "== PostgreSQL did not start on port $port (attempt $attempt)" >&2
    done
    if [ -z "$started" ]; then
        cat "$PG_TEST_DIR/server.log" >&2
        return 1
    fi
    export TASKGATE_TEST_PG_URL="postgres://postgres@localhost:$port/postgres?sslmode=verify-full&sslrootcert=$PG_TEST_DIR/ca.pem"
    export TASKGATE_TEST_PG_DIR="$PG_TEST_DIR"
    export TASKGATE_TEST_PG_CA="$PG_TEST_DIR/ca.pem"
    echo "== PostgreSQL (TLS only) ready at localhost:$port in $((($(date +%s%N) - t0) / 1000000)) ms"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case "${1:-}" in
        run)
            shift
            pg_start
            "$@"
            ;;
        *)
            echo "usage: bash scripts/pg.sh run CMD [ARGS…]   (or source it and call pg_start)" >&2
            exit 2
            ;;
    esac
fi
