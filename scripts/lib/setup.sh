# Shared set-up for scripts/test and scripts/demo: install and start what Palisade needs on a
# Debian machine. Sourced, not run.
#
# What it changes on the system: Debian packages (protobuf-compiler, etcd-server,
# etcd-client, postgresql-client, chromium, postgresql, prometheus (for promtool),
# iproute2, iptables, faketime (the chaos harness's network hosts and clock jumps),
# pgbouncer, python3-psycopg, nginx-light (the proxy bench), python3-venv when missing;
# the system etcd, prometheus, pgbouncer and nginx services are stopped and disabled), cargo-nextest in cargo's bin directory,
# PostgreSQL's pg_hba.conf (trust on loopback) when no server answers on 5432,
# redis-server and mariadb-server (started, and MariaDB's root@localhost also allowed an
# empty password over TCP) when nothing answers on 6379 and 3306, and schemathesis, redis
# and PyMySQL from PyPI, pinned, in a virtual environment under
# ${XDG_CACHE_HOME:-$HOME/.cache}/palisade-venv (not the system's Python).

step() { printf '\n==> %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
    step "installing $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null ||
        { as_root apt-get update -q >/dev/null && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
}

palisade_install_deps() {
    local missing=()
    command -v protoc >/dev/null || missing+=(protobuf-compiler)
    command -v etcd >/dev/null || missing+=(etcd-server)
    command -v etcdctl >/dev/null || missing+=(etcd-client)
    command -v pg_isready >/dev/null || missing+=(postgresql-client)
    # The audit dashboard's browser test runs Debian's headless Chromium.
    command -v chromium >/dev/null || missing+=(chromium)
    # The chaos harness runs a private PostgreSQL cluster of its own (initdb, pg_ctl):
    # the server binaries are needed even when a PostgreSQL already answers on 5432.
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
    # The fence's pooler tests start their own PgBouncer (transaction pool mode) in front
    # of PostgreSQL; the SQL API examples run from psql and from Python with psycopg 3
    # (Debian's python3, /usr/bin/python3).
    [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
    command -v psql >/dev/null || missing+=(postgresql-client)
    # The alerting rules in ops/ are checked with promtool, from Debian's prometheus package.
    command -v promtool >/dev/null || missing+=(prometheus)
    /usr/bin/python3 -c 'import psycopg' 2>/dev/null || missing+=(python3-psycopg)
    # The chaos harness's network hosts: namespaces and veths (ip, from iproute2), cuts
    # between hosts (iptables, run inside the namespaces only), netem (tc), and wall-clock
    # jumps (libfaketime, from Debian's faketime).
    command -v ip >/dev/null || missing+=(iproute2)
    command -v tc >/dev/null || missing+=(iproute2)
    command -v iptables >/dev/null || missing+=(iptables)
    [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || missing+=(faketime)
    # The connection tests start palisade under an open-file limit (prlimit).
    command -v prlimit >/dev/null || missing+=(util-linux)
    # The fencing proxy's bench compares it with nginx (Debian's nginx-light), which the
    # bench starts on a free port with its own config; its smoke test runs in the tests.
    [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
    if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
    # The etcd-server package starts a system etcd on the default ports; tests and the demo
    # run their own members on free ports, so a system one is only in the way.
    if command -v systemctl >/dev/null && systemctl is-active --quiet etcd 2>/dev/null; then
        as_root systemctl disable --now etcd >/dev/null 2>&1 || true
    fi
    # Likewise the Prometheus server the prometheus package starts (only promtool is used).
    if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
        as_root systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
    # Likewise the system nginx the nginx packages start on port 80.
    if command -v systemctl >/dev/null && systemctl is-active --quiet nginx 2>/dev/null; then
        as_root systemctl disable --now nginx >/dev/null 2>&1 || true
    elif [ -s /run/nginx.pid ] && [ -x /usr/sbin/nginx ]; then
        as_root /usr/sbin/nginx -s quit >/dev/null 2>&1 || true
    fi
    # Likewise the system PgBouncer the pgbouncer package starts on port 6432.
    if command -v systemctl >/dev/null && systemctl is-active --quiet pgbouncer 2>/dev/null; then
        as_root systemctl disable --now pgbouncer >/dev/null 2>&1 || true
    fi
    if ! command -v cargo-nextest >/dev/null; then
        step "installing cargo-nextest"
        cargo install --locked cargo-nextest
    fi
}

# The Python packages the tests run, pinned, in a virtual environment outside the clone:
# schemathesis (the OpenAPI fuzz test, crates/server/tests/schemathesis.rs), redis and
# PyMySQL (the Redis and MariaDB fence examples, run from Python).
PALISADE_SCHEMATHESIS_VERSION=4.32.5
PALISADE_VENV_PACKAGES=("schemathesis==$PALISADE_SCHEMATHESIS_VERSION" "redis==5.2.1" "PyMySQL==1.1.1")

# Installs PALISADE_VENV_PACKAGES from PyPI into a Python virtual environment outside the
# clone, ${XDG_CACHE_HOME:-$HOME/.cache}/palisade-venv (python3-venv from apt if
# `python3 -m venv` is missing), and exports PALISADE_SCHEMATHESIS (its schemathesis
# command) and PALISADE_VENV_PYTHON (its interpreter). Nothing is installed into the system's
# Python.
palisade_install_schemathesis() {
    local venv="${XDG_CACHE_HOME:-$HOME/.cache}/palisade-venv"
    export PALISADE_SCHEMATHESIS="$venv/bin/schemathesis"
    export PALISADE_VENV_PYTHON="$venv/bin/python"
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" - "${PALISADE_VENV_PACKAGES[@]}" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(any(m.version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))
PY
    then
        return 0
    fi
    command -v python3 >/dev/null || apt_install python3
    python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
    step "installing ${PALISADE_VENV_PACKAGES[*]} into $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${PALISADE_VENV_PACKAGES[@]}"
}

# Makes sure Redis answers on 127.0.0.1:6379: installs and starts Debian's redis-server
# when nothing does. The Redis fence's tests use a key prefix of their own there; those
# that restart a server start a private redis-server on a free port.
palisade_ensure_redis() {
    command -v redis-server >/dev/null || apt_install redis-server
    if redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then return 0; fi
    step "starting redis-server on 127.0.0.1:6379"
    if command -v systemctl >/dev/null && systemctl start redis-server 2>/dev/null; then :; else
        as_root redis-server --bind 127.0.0.1 --port 6379 --daemonize yes --save '' --appendonly no >/dev/null
    fi
    for _ in $(seq 1 30); do
        redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG && return 0
        sleep 1
    done
    echo "Redis did not come up on 127.0.0.1:6379" >&2
    return 1
}

# Makes sure MariaDB answers on 127.0.0.1:3306 as root with an empty password: installs
# and starts Debian's mariadb-server when nothing answers, and then lets root@localhost log
# in over TCP with an empty password as well as by its Unix socket (Debian's default is the
# socket only). The MariaDB fence's tests create a database of their own for every run.
palisade_ensure_mariadb() {
    command -v mariadb >/dev/null || apt_install mariadb-client
    if mariadb -h 127.0.0.1 -P 3306 -u root -e 'SELECT 1' >/dev/null 2>&1; then return 0; fi
    command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || apt_install mariadb-server
    step "starting MariaDB on 127.0.0.1:3306"
    if command -v systemctl >/dev/null && systemctl start mariadb 2>/dev/null; then :; else
        as_root install -d -o mysql -g mysql /run/mysqld
        as_root sh -c '/usr/bin/mariadbd-safe --bind-address=127.0.0.1 >/dev/null 2>&1 &'
    fi
    for _ in $(seq 1 30); do
        mariadb-admin -u root ping >/dev/null 2>&1 && break
        sleep 1
    done
    step "letting root@localhost log in over TCP with an empty password (MariaDB, for the tests)"
    as_root mariadb -u root -e "ALTER USER root@localhost IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('')"
    mariadb -h 127.0.0.1 -P 3306 -u root -e 'SELECT 1' >/dev/null && return 0
    echo "MariaDB did not come up on 127.0.0.1:3306 for root" >&2
    return 1
}

# Makes sure PostgreSQL answers on 127.0.0.1:5432 with trust authentication for loopback.
palisade_ensure_postgres() {
    if pg_isready -q -h 127.0.0.1 -p 5432; then return 0; fi
    if ! command -v pg_ctlcluster >/dev/null || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
        apt_install postgresql
    fi
    local version cluster hba
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    cluster=main
    hba="/etc/postgresql/$version/$cluster/pg_hba.conf"
    if ! grep -q '^# palisade: loopback trust' "$hba"; then
        step "allowing trust authentication on loopback for local tests ($hba)"
        as_root sed -i '1i # palisade: loopback trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    fi
    step "starting PostgreSQL $version/$cluster"
    as_root pg_ctlcluster "$version" "$cluster" start || as_root pg_ctlcluster "$version" "$cluster" reload
    for _ in $(seq 1 30); do
        pg_isready -q -h 127.0.0.1 -p 5432 && return 0
        sleep 1
    done
    echo "PostgreSQL did not come up on 127.0.0.1:5432" >&2
    return 1
}

# etcd 3.5: Debian unstable's etcd-server and etcd-client, pinned by version and by the
# sha256 of each .deb. The tests run on both this and the system's etcd 3.4 (Debian 12).
PALISADE_ETCD35_VERSION=3.5.30-2
PALISADE_ETCD35_SHA256_SERVER=11a4f7e350c5020b83edff5160a6063d4e56ac9cd014d21ce8916378bf96de79
PALISADE_ETCD35_SHA256_CLIENT=1e66ad2aba4cba6842a1ac35d5c525e750102b8fb42748225bcb2e34d6595931

# Fetches etcd 3.5 without touching the system's apt configuration or package state and
# exports PALISADE_ETCD35, the path of its `etcd` (`etcdctl` and `etcdutl` lie next to it).
#
# apt-get runs with a private sources list (Debian unstable, main), lists directory and
# cache directory, all under ${XDG_CACHE_HOME:-$HOME/.cache}/palisade-etcd/apt (removed
# afterwards); nothing under /etc/apt, /var/lib/apt, /var/cache/apt or /var/lib/dpkg is
# written and nothing is installed. The two .deb files
# must match the pinned sha256 sums; they are unpacked with `dpkg-deb -x` into
# ${XDG_CACHE_HOME:-$HOME/.cache}/palisade-etcd/$PALISADE_ETCD35_VERSION. Later runs find
# the unpacked binaries there and fetch nothing.
palisade_install_etcd35() {
    local cache="${XDG_CACHE_HOME:-$HOME/.cache}/palisade-etcd"
    local want="$PALISADE_ETCD35_VERSION"
    local root="$cache/$want"
    export PALISADE_ETCD35="$root/usr/bin/etcd"
    if [ -x "$PALISADE_ETCD35" ] && [ -x "$root/usr/bin/etcdctl" ] && [ -x "$root/usr/bin/etcdutl" ] &&
        [ "$(cat "$root/SHA256SUMS" 2>/dev/null)" = "$(palisade_etcd35_sums)" ]; then
        return 0
    fi
    step "fetching etcd $want (Debian unstable's etcd-server, etcd-client) into $root"
    local apt="$cache/apt"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources.list.d" \
        "$apt/preferences.d" "$apt/debs"
    echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian unstable main' \
        >"$apt/sources.list"
    local opts=(
        -o "Dir::Etc::SourceList=$apt/sources.list"
        -o "Dir::Etc::SourceParts=$apt/sources.list.d"
        -o "Dir::Etc::Preferences=$apt/preferences"
        -o "Dir::Etc::PreferencesParts=$apt/preferences.d"
        -o "Dir::State::Lists=$apt/lists"
        -o "Dir::Cache=$apt/cache"
        # Downloads run as the invoking user: apt's _apt user cannot write these dirs.
        -o "APT::Sandbox::User=$(id -un)"
    )
    apt-get -q "${opts[@]}" update >/dev/null
    rm -f "$apt/debs"/*.deb
    if ! (cd "$apt/debs" && apt-get -q "${opts[@]}" download "etcd-server=$want" "etcd-client=$want" >/dev/null); then
        echo "etcd-server/etcd-client $want is no longer in Debian unstable; it has:" >&2
        apt-cache "${opts[@]}" policy etcd-server | sed -n 's/^ *Candidate: */  /p' >&2
        echo "update PALISADE_ETCD35_VERSION and the sha256 sums in scripts/lib/setup.sh" >&2
        return 1
    fi
    local deb sum name expected
    for deb in "$apt/debs"/*.deb; do
        name=$(basename "$deb")
        case "$name" in
        etcd-server_*) expected=$PALISADE_ETCD35_SHA256_SERVER ;;
        etcd-client_*) expected=$PALISADE_ETCD35_SHA256_CLIENT ;;
        *) continue ;;
        esac
        sum=$(sha256sum "$deb" | cut -d' ' -f1)
        if [ "$sum" != "$expected" ]; then
            echo "$name: sha256 $sum, expected $expected (scripts/lib/setup.sh)" >&2
            return 1
        fi
    done
    rm -rf "$root"
    mkdir -p "$root"
    for deb in "$apt/debs"/*.deb; do dpkg-deb -x "$deb" "$root"; done
    palisade_etcd35_sums >"$root/SHA256SUMS"
    # The lists are only needed again for another version.
    rm -rf "$apt"
    local version
    version=$("$PALISADE_ETCD35" --version)
    echo "${version%%$'\n'*}"
}

palisade_etcd35_sums() {
    printf 'etcd-server %s %s\netcd-client %s %s\n' \
        "$PALISADE_ETCD35_VERSION" "$PALISADE_ETCD35_SHA256_SERVER" \
        "$PALISADE_ETCD35_VERSION" "$PALISADE_ETCD35_SHA256_CLIENT"
}
