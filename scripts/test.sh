#!/usr/bin/env bash
# The test command (README, CI): system packages, Python environment, local services, ruff, pytest.
#
#   scripts/test.sh [PYTEST_ARGS...]     e.g. scripts/test.sh -m "not integration" -x
#
# 1. apt-get installs what is missing (MariaDB, PostgreSQL 15 + wal2json, ZooKeeper, a JRE,
#    Maven, python3-venv) -- only when something is missing.
# 2. .venv in the repo (python3, or $PYTHON) with `pip install -e '.[test]'`; re-run only when
#    pyproject.toml changed (DBLOG_PIP_INSTALL=1 forces it).
# 3. scripts/services.sh up (MariaDB, PostgreSQL, ZooKeeper, Kafka, the S3 object store, the Spark
#    standalone cluster, Spark connector jars).
# 4. ruff check . and pytest "$@". Exit status: pytest's (5 = no tests collected counts as a
#    failure), or ruff's if only ruff failed.
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

PYTHON=${PYTHON:-python3}

# --- 1. system packages ----------------------------------------------------------------------
extra=()
command -v "$PYTHON" >/dev/null 2>&1 || extra+=(python3)
# Debian's python3 needs python3-venv for `-m venv` (ensurepip); other Pythons bring it along.
if command -v "$PYTHON" >/dev/null 2>&1 && ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    extra+=(python3-venv)
fi
# tests/provider/test_browser_e2e.py drives Debian's Chromium through Playwright (no download).
[ -x /usr/bin/chromium ] || extra+=(chromium fonts-liberation)
say "checking system packages"
scripts/services.sh deps "${extra[@]}"

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
stamp=$VENV/.airflow-dblog-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "${DBLOG_PIP_INSTALL:-0}" = 1 ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] \
    || ! "$VENV/bin/python" -c 'import airflow_dblog' 2>/dev/null; then
    say "pip install -e '.[test]' into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -e '.[test]'
    echo "$want" >"$stamp"
else
    say "$VENV is up to date with pyproject.toml (DBLOG_PIP_INSTALL=1 reinstalls)"
fi
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV=$VENV

# --- 3. services -----------------------------------------------------------------------------
say "starting local services"
scripts/services.sh up
eval "$(scripts/services.sh env)"

# --- 4. lint and tests -----------------------------------------------------------------------
if [ "${DBLOG_SETUP_ONLY:-0}" = 1 ]; then
    say "DBLOG_SETUP_ONLY=1: set up, not testing"
    exit 0
fi
say "ruff check ."
ruff_rc=0
ruff check . || ruff_rc=$?

say "pytest $*"
pytest_rc=0
pytest "$@" || pytest_rc=$?

if [ "$pytest_rc" = 5 ]; then
    say "pytest collected no tests: that is a failure"
elif [ "$pytest_rc" != 0 ]; then
    say "pytest failed (exit $pytest_rc)"
fi
[ "$ruff_rc" = 0 ] || say "ruff check failed (exit $ruff_rc)"
[ "$pytest_rc" != 0 ] && exit "$pytest_rc"
exit "$ruff_rc"
