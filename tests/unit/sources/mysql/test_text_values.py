import pytest
from pymysql.converters import convert_date, convert_datetime

from airflow_dblog.sources.mysql.text_values import to_date, to_datetime

DATETIMES = [
    "2024-01-01 00:00:00",
    "2024-01-01 00:00:05.000005",
    "2024-01-01 00:00:05.000000",
    "2024-12-31 23:59:59.999999",
    "2024-01-01 00:00:01.5",
    "2024-01-01 00:00:01.12",
    "2024-01-01 00:00:01.123",
    "2024-01-01 00:00:01.1234",
    "2024-01-01 00:00:01.12345",
    "0001-01-01 00:00:00",
    "9999-12-31 23:59:59.999999",
    "0000-00-00 00:00:00",
    "2024-02-31 10:00:00",
    "2024-00-10 10:00:00",
    "2024-01-01 24:00:00",
    "2024-01-01T10:00:00",
]
DATES = ["2024-01-01", "0001-01-01", "9999-12-31", "0000-00-00", "2024-02-31", "2024-13-01"]


def _same(ours: object, pymysql_s: object) -> None:
    assert type(ours) is type(pymysql_s)
    assert ours == pymysql_s


@pytest.mark.parametrize("text", DATETIMES)
def test_a_datetime_text_reads_as_pymysql_reads_it(text: str) -> None:
    _same(to_datetime(text), convert_datetime(text))


@pytest.mark.parametrize("text", DATES)
def test_a_date_text_reads_as_pymysql_reads_it(text: str) -> None:
    _same(to_date(text), convert_date(text))
