"""The Java options every session's JVMs start with."""

from __future__ import annotations

from airflow_dblog.spark.session import JIT_OPTIONS, jit_first


def test_the_jit_options_go_first_so_options_given_in_the_config_win() -> None:
    conf = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4 -Da=1"}
    assert jit_first(conf) == {
        "spark.driver.extraJavaOptions": f"{JIT_OPTIONS} -XX:TieredStopAtLevel=4 -Da=1",
        "spark.executor.extraJavaOptions": JIT_OPTIONS,
    }


def test_c1_alone_keeps_the_code_cache_spark_and_delta_fill() -> None:
    assert "-XX:TieredStopAtLevel=1" in JIT_OPTIONS.split()
    assert "-XX:ReservedCodeCacheSize=240m" in JIT_OPTIONS.split()
