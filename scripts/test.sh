#!/usr/bin/env bash
# The test command (README, CI): system packages, Python environment, local services, ruff,
# lint-imports, pytest.
#
#   scripts/test.sh [--unit | --integration | --system] [PYTEST_ARGS...]
#
#   (no tier)      every test (CI), e.g. scripts/test.sh -x
#   --unit         tests/unit only: no server, no JVM, two at a time. Steps 1 and 3 are skipped
#                  (no apt-get, no services); the .venv, the linters and the tests run as below.
#   --integration  tests/integration only: one real server at a time.
#   --system       tests/system only: the whole job (stream processes, the Spark cluster, Airflow).
#
# 1. apt-get installs what is missing (MariaDB, PostgreSQL 15 + wal2json, ZooKeeper, a JRE,
#    Maven, python3-venv, libmariadb-dev) -- only when something is missing.
# 2. .venv in the repo (python3, or $PYTHON) with `uv pip install -e '.[test,mysqlclient]'` (uv
#    from PyPI; --unit: '.[test]');
#    re-run only when pyproject.toml changed (DBLOG_PIP_INSTALL=1 forces it).
# 3. scripts/services.sh up (MariaDB, PostgreSQL, ZooKeeper, Kafka, the S3 object store -- built
#    from the Go module proxy, in the background from the start --, the Spark standalone cluster,
#    Spark connector jars).
# 4. ruff check ., lint-imports (the package's layers, pyproject.toml's [tool.importlinter]) and
#    pytest [the tier's folder] "$@" (with no tier and no test named, parts run side by side:
#    see step 3). Exit status: pytest's (5 = no tests collected counts as a
#    failure), else ruff's, else lint-imports'.
#
# Services are left running afterwards (fast re-runs); DBLOG_STOP_SERVICES=1 stops them.
# DBLOG_SETUP_ONLY=1 stops after step 3 (scripts/demo.sh uses it).
# Runs unattended (CI=true, no stdin).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"
exec </dev/null
export PYTHONUNBUFFERED=1 DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf '\n[test.sh] %s\n' "$*" >&2; }
# shellcheck disable=SC2317 # invoked by the EXIT trap
on_exit() {
    local rc=$?
    if [ "${DBLOG_STOP_SERVICES:-0}" = 1 ]; then
        say "DBLOG_STOP_SERVICES=1: stopping services"
        scripts/services.sh down || true
    fi
    exit "$rc"
}
trap on_exit EXIT

tier=
case "${1:-}" in
    --unit | --integration | --system)
        tier=${1#--}
        shift
        ;;
esac
tier_paths=()
[ -z "$tier" ] || tier_paths=("tests/$tier")

PYTHON=${PYTHON:-python3}

# The object store's S3 server is built from the Go module proxy once per machine (a minute of
# downloads and compiling): in the background from here, while apt-get, the Python environment
# and the other services start; the object store, started last, waits for it (a failed build is
# tried again there, in the foreground, and reported).
if [ "$tier" != unit ]; then
    scripts/services.sh s3-server >/dev/null 2>&1 &
fi

# --- 1. system packages ----------------------------------------------------------------------
if [ "$tier" = unit ]; then
    say "--unit: no system packages, no services"
    if [ ! -x "$REPO_ROOT/.venv/bin/python" ] && ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null
    then
        say "$PYTHON cannot create a venv: apt-get install python3-venv (or run without --unit)"
        exit 1
    fi
else
    extra=()
    command -v "$PYTHON" >/dev/null 2>&1 || extra+=(python3)
    # Debian's python3 needs python3-venv for `-m venv` (ensurepip); other Pythons bring it.
    if command -v "$PYTHON" >/dev/null 2>&1 && ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null
    then
        extra+=(python3-venv)
    fi
    # tests/system/provider/test_browser_e2e.py drives Debian's Chromium through Playwright
    # (no browser download).
    [ -x /usr/bin/chromium ] || extra+=(chromium fonts-liberation)
    # the mysqlclient extra (chunk SELECTs parsed in C) builds against libmariadb
    [ -f /usr/include/mariadb/mysql.h ] || extra+=(libmariadb-dev)
    command -v pkg-config >/dev/null 2>&1 || extra+=(pkg-config)
    command -v gcc >/dev/null 2>&1 || extra+=(gcc)
    say "checking system packages"
    scripts/services.sh deps "${extra[@]}"
fi

if [ -z "${JAVA_HOME:-}" ] && command -v java >/dev/null 2>&1; then
    JAVA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")
    export JAVA_HOME
fi

# --- 2. Python environment -------------------------------------------------------------------
VENV=$REPO_ROOT/.venv
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
# --unit leaves out the mysqlclient extra: it compiles against libmariadb (step 1's packages)
extras=$([ "$tier" = unit ] && echo test || echo test,mysqlclient)
stamp=$VENV/.airflow-dblog-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $extras"
if [ "${DBLOG_PIP_INSTALL:-0}" = 1 ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] \
    || ! "$VENV/bin/python" -c 'import airflow_dblog' 2>/dev/null; then
    # uv: the install pip would make, with parallel downloads
    say "uv pip install -e '.[$extras]' into $VENV"
    "$VENV/bin/python" -m pip install -q uv
    "$VENV/bin/uv" pip install --python "$VENV/bin/python" -e ".[$extras]"
    echo "$want" >"$stamp"
else
    say "$VENV is up to date with pyproject.toml (DBLOG_PIP_INSTALL=1 reinstalls)"
fi
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV=$VENV

# --- 3. services -----------------------------------------------------------------------------
# Every tier (CI) with no test named: on two cores, parts that share no server run side by side
# (each one's report printed whole when it ends): the unit tier (no server) while the services
# start; the integration tests that touch no database (the Delta and Kafka sinks, the Spark
# session) beside those that do; then the system tier, two tests at a time (pytest-xdist), and
# its tests marked `alone` one at a time (also with --system).
named=0
for arg in "$@"; do
    case "$arg" in -*) ;; *) named=1 ;; esac # a test path or an option's value: run as asked
done
split=$([ -z "$tier" ] && [ "${DBLOG_SETUP_ONLY:-0}" != 1 ] && [ "$named" = 0 ] && echo 1 || echo 0)
BESIDE=(tests/integration/sinks tests/integration/spark/test_session.py
    tests/integration/spark/test_class_archive.py tests/integration/spark/test_stream_job.py)
pytest_rc=0
beside_pid=
beside() { # NAME PYTEST_ARGS...: pytest in the background, its report in a file
    beside_log=$(mktemp)
    say "pytest ${*:2} (in the background: $1)"
    pytest "${@:2}" >"$beside_log" 2>&1 &
    beside_pid=$!
}
collect() { # wait for the background pytest, print its report, keep its status
    local rc=0
    wait "$beside_pid" || rc=$?
    cat "$beside_log"
    rm -f "$beside_log"
    [ "$rc" = 0 ] || say "that pytest failed (exit $rc)"
    [ "$pytest_rc" != 0 ] || pytest_rc=$rc
}
[ "$split" = 0 ] || beside "while the services start" tests/unit -n 2 "$@"
if [ "$tier" != unit ]; then
    say "starting local services"
    scripts/services.sh up
    eval "$(scripts/services.sh env)"
fi
[ "$split" = 0 ] || collect

# --- 4. lint and tests -----------------------------------------------------------------------
if [ "${DBLOG_SETUP_ONLY:-0}" = 1 ]; then
    say "DBLOG_SETUP_ONLY=1: set up, not testing"
    exit 0
fi
say "ruff check ."
ruff_rc=0
ruff check . || ruff_rc=$?

say "lint-imports (layers)"
layers_rc=0
lint-imports --no-cache --no-logo || layers_rc=$?

run() { # PYTEST_ARGS...: in the foreground
    local rc=0
    say "pytest $*"
    pytest "$@" || rc=$?
    [ "$pytest_rc" != 0 ] || pytest_rc=$rc
}
system_tier() { # two system tests at a time, then those marked alone one by one
    run tests/system -m "not alone" -n 2 --dist worksteal "$@"
    run tests/system -m alone "$@"
}
if [ "$split" = 1 ]; then
    beside "beside the database tests" "${BESIDE[@]}" "$@"
    run tests/integration "${BESIDE[@]/#/--ignore=}" "$@"
    collect
    system_tier "$@"
elif [ "$tier" = system ] && [ "$named" = 0 ]; then
    system_tier "$@"
elif [ "$tier" = unit ] && [ "$named" = 0 ]; then
    run tests/unit -n 2 "$@" # no server, no JVM: both cores
else
    run ${tier_paths[@]+"${tier_paths[@]}"} "$@"
fi

if [ "$pytest_rc" = 5 ]; then
    say "pytest collected no tests: that is a failure"
elif [ "$pytest_rc" != 0 ]; then
    say "pytest failed (exit $pytest_rc)"
fi
[ "$ruff_rc" = 0 ] || say "ruff check failed (exit $ruff_rc)"
[ "$layers_rc" = 0 ] || say "lint-imports failed (exit $layers_rc)"
[ "$pytest_rc" != 0 ] && exit "$pytest_rc"
[ "$ruff_rc" != 0 ] && exit "$ruff_rc"
exit "$layers_rc"
