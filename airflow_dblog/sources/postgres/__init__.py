"""PostgreSQL: the source (``source``), its wal2json reader (``wal2json_reader``), the WAL value
codecs, the coercion of user-given keys, the keyset dialect, the watermark strategies and the
lag query. Importing this package imports no driver; its modules import psycopg2."""
