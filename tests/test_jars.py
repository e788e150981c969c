"""Fetching jars from Maven Central (kprod_broker.jars) with PySpark's Ivy: a fetch that
fails leaves no folder behind to be taken for a cache entry, and its error says what to do."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from kprod_broker import KafkaUnavailableError, spark_kafka_jars
from kprod_broker.jars import SPARK_PACKAGES_VERSION


def test_the_pyspark_the_errors_name_is_the_one_make_venv_installs() -> None:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert f"pyspark[connect]=={SPARK_PACKAGES_VERSION}" in project["project"]["optional-dependencies"]["dev"]


@pytest.mark.jvm  # Ivy runs in a JVM
def test_a_failed_fetch_leaves_no_folder_is_tried_again_and_says_what_to_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As PySpark 4.3.0 from PyPI, whose spark-sql-kafka Maven Central does not serve (one
    case for both: each fetch is an Ivy JVM)."""
    monkeypatch.setenv("KPROD_CACHE", str(tmp_path))
    for _ in range(2):  # the second is fetched again, not read from a half-made entry
        with pytest.raises(KafkaUnavailableError) as failed:
            spark_kafka_jars("0.0.1")
        text = str(failed.value)
        assert text.startswith("spark-sql-kafka-0-10_2.13 0.0.1 (the package of the PySpark installed here) "
                               "cannot be fetched"), text
        assert "pip install 'pyspark==4.2.0'" in text and "--skip-spark-kafka" in text, text
        assert "Ivy could not fetch org.apache.spark:spark-sql-kafka-0-10_2.13:0.0.1" in text, text
        assert not (tmp_path / "spark-sql-kafka-0.0.1").exists()
