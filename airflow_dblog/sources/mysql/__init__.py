"""MySQL and MariaDB: the source (``source``), its binlog reader (``binlog_reader``), the binlog
value codecs, the coercion of user-given keys, the keyset dialect, the watermark strategies and
the lag query. Importing this package imports no driver; its modules import PyMySQL."""
