# shellcheck shell=bash
# Helpers shared by scripts/test and scripts/quickstart: where things are,
# installing the Debian packages the project needs, and building it.
# Source this file; it defines functions and variables and runs nothing.

PGB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PGB_BUILD="$PGB_ROOT/build"
PGB_BIN="$PGB_BUILD/pgbouncer"
PGB_CONFIGURE_ARGS=(--enable-werror --enable-cassert)

# The packages of scripts/debian-packages with the roles given (build, dev,
# test, run, package), one per line. scripts/check-packages keeps that list in
# step with configure.ac and debian/control.
pgb_package_list() {
    awk -v roles=" $* " '!/^[ \t]*(#|$)/ && index(roles, " " $1 " ") { print $2 }' \
        "$PGB_ROOT/scripts/debian-packages"
}

# Everything needed to build, test and run the quickstart on Debian 12.
mapfile -t PGB_PACKAGES < <(pgb_package_list build dev test run)

# The unprivileged user the integration tests run PostgreSQL and pgbouncer as.
PGB_TEST_USER=pgbtest

pgb_say() { printf '==> %s\n' "$*"; }
pgb_warn() { printf 'warning: %s\n' "$*" >&2; }
pgb_die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

# Prints the packages of the arguments that are not installed, one per line.
pgb_missing_packages() {
    local p
    for p in "$@"; do
        if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
            echo "$p"
        fi
    done
}

# Installs the missing packages of the arguments, by default PGB_PACKAGES.
# apt-get runs only when something is missing; without root it goes through
# sudo, and without sudo it names what to install and exits.
pgb_install_packages() {
    local wanted=("$@")
    [ "${#wanted[@]}" -gt 0 ] || wanted=("${PGB_PACKAGES[@]}")
    if ! command -v dpkg-query >/dev/null; then
        pgb_warn "not a Debian system: make sure the equivalents of these are installed: ${wanted[*]}"
        return 0
    fi
    local missing
    mapfile -t missing < <(pgb_missing_packages "${wanted[@]}")
    if [ "${#missing[@]}" -eq 0 ]; then
        return 0
    fi
    pgb_say "installing missing packages: ${missing[*]}"
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null; then
            pgb_die "not root and no sudo: install these packages first: apt-get install ${missing[*]}"
        fi
        sudo=(sudo)
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
        pgb_die "apt-get update failed"
    # apt-get -y removes what conflicts with the packages asked for, e.g. this
    # project's own pgbouncer-multiworker (Conflicts: pgbouncer) for Debian's
    # pgbouncer of the run lines: a script that installs what it needs must not
    # take a package, or a running pooler, off the machine.
    local removed
    removed="$(LC_ALL=C apt-get install -s -q --no-install-recommends "${missing[@]}" </dev/null 2>/dev/null |
        sed -n 's/^Remv \([^ ]*\).*/\1/p' | xargs)"
    [ -z "$removed" ] ||
        pgb_die "installing ${missing[*]} would remove ${removed}: not done; install them yourself if that is what you want (apt-get install ${missing[*]})"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null ||
        pgb_die "apt-get install failed for: ${missing[*]}"
}

# Creates the unprivileged test user when running as root (the pytest
# harness would create it too; doing it here keeps the test run's output clean).
pgb_ensure_test_user() {
    if [ "$(id -u)" -eq 0 ] && ! id "$PGB_TEST_USER" >/dev/null 2>&1; then
        pgb_say "creating system user $PGB_TEST_USER"
        useradd --system --no-create-home --shell /usr/sbin/nologin "$PGB_TEST_USER" ||
            pgb_die "useradd $PGB_TEST_USER failed"
    fi
}

# True if $1 is missing or older than any of the remaining files.
pgb_outdated() {
    local target="$1" f
    shift
    [ -e "$target" ] || return 0
    for f in "$@"; do
        [ "$f" -nt "$target" ] && return 0
    done
    return 1
}

# Builds build/pgbouncer out of tree. autogen and configure run when their
# output is missing or stale (or PGB_RECONFIGURE=1); after that the generated
# Makefile keeps itself up to date (it reruns automake when Makefile.am changes).
# A tree configured in place (README, "Building by hand") is built where it
# is, as it was configured: PGB_BUILD and PGB_BIN then point into it.
# Otherwise PGB_BUILD and PGB_CONFIGURE_ARGS choose the build (build/,
# build-asan/, build-fuzz/); arguments are make targets to build instead of
# the default (then PGB_BIN need not exist).
pgb_build() {
    cd "$PGB_ROOT" || return 1
    if [ -f config.status ]; then
        PGB_BUILD="$PGB_ROOT"
        PGB_BIN="$PGB_ROOT/pgbouncer"
        pgb_say "the source tree is configured in place: make -j2 there"
        make -C "$PGB_ROOT" -j2 "$@" || pgb_die "build failed"
        [ "$#" -gt 0 ] || [ -x "$PGB_BIN" ] || pgb_die "build finished but $PGB_BIN is missing"
        return 0
    fi
    if [ "${PGB_RECONFIGURE:-0}" = 1 ] || [ ! -f Makefile.in ] || pgb_outdated configure configure.ac autogen.sh; then
        pgb_say "./autogen.sh"
        ./autogen.sh || pgb_die "autogen.sh failed"
    fi
    mkdir -p "$PGB_BUILD"
    # Reconfigure when configure changed or build/ was configured with other options.
    # (config.status --config quotes arguments only when they need it)
    local have_args=""
    if [ -x "$PGB_BUILD/config.status" ]; then
        have_args="$("$PGB_BUILD/config.status" --config 2>/dev/null)"
        have_args="${have_args//\'/}"
    fi
    if [ "${PGB_RECONFIGURE:-0}" = 1 ] || pgb_outdated "$PGB_BUILD/config.status" configure ||
        [ "$have_args" != "${PGB_CONFIGURE_ARGS[*]}" ]; then
        pgb_say "configure ${PGB_CONFIGURE_ARGS[*]} (in ${PGB_BUILD#"$PGB_ROOT"/}/)"
        (cd "$PGB_BUILD" && ../configure "${PGB_CONFIGURE_ARGS[@]}") || pgb_die "configure failed"
    fi
    pgb_say "make -j2 $*"
    make -C "$PGB_BUILD" -j2 "$@" || pgb_die "build failed"
    [ "$#" -gt 0 ] || [ -x "$PGB_BIN" ] || pgb_die "build finished but $PGB_BIN is missing"
}

# Highest installed PostgreSQL server bindir (/usr/lib/postgresql/N/bin).
pgb_pg_bindir() {
    local d best="" bestv=0 v
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/initdb" ] || continue
        v="$(basename "$(dirname "$d")")"
        v="${v%%.*}"
        if [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt "$bestv" ]; then
            best="$d"
            bestv="$v"
        fi
    done
    [ -n "$best" ] || pgb_die "no PostgreSQL server found under /usr/lib/postgresql (install the Debian package 'postgresql')"
    echo "$best"
}

# True if something accepts TCP connections on 127.0.0.1:$1.
pgb_port_busy() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
