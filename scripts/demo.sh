#!/usr/bin/env bash
# The demo (README): prepare the machine as the tests do, then stream a live MariaDB database
# into Delta Lake under ./demo-output, dump it while a write load runs, and check the result.
#
#   scripts/demo.sh [OUTPUT_DIR]      (default: demo-output)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DBLOG_SETUP_ONLY=1 scripts/test.sh
eval "$(scripts/services.sh env)"
exec .venv/bin/python -m airflow_dblog.demo --output "${1:-demo-output}"
