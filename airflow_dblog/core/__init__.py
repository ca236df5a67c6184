"""The DBLog algorithm, pure: events and positions, keys, chunk windows, the watermark merge,
GTID sets. No I/O, no Spark, no Airflow: everything else builds on these."""
