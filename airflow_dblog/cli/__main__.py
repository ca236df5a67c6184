"""``python -m airflow_dblog.cli``: the ``dblog`` command (the launcher starts streams this way)."""

import sys

from airflow_dblog.cli import main

sys.exit(main())
