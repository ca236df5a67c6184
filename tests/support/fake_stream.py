"""A stand-in for ``python -m airflow_dblog.cli stream -c FILE``, for launcher tests: an
executable that commits the stream's heartbeat to the metadata store every 0.2 s, as the
stream does, then sleeps; no JVM. Pass its path as the launcher's ``python``."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """#!{python}
import sys, time
sys.path.insert(0, {repo!r})
from airflow_dblog.config import load_config
from airflow_dblog.engine.metadata import MetadataStore
from airflow_dblog.engine.metadata.database import utcnow
config = load_config(sys.argv[-1])
store = MetadataStore(config.metadata_url)
print("fake stream up", flush=True)
while True:
    store.save_stream_state(config.name, heartbeat_at=utcnow())
    time.sleep(0.2)
"""


def fake_python(folder: Path) -> str:
    """Write the stand-in into ``folder``; its path."""
    script = folder / "fake-python"
    script.write_text(SCRIPT.format(python=sys.executable, repo=str(REPO)))
    script.chmod(0o755)
    return str(script)
