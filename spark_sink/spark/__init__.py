"""The ``kprod`` Spark data source: batch and streaming writes to Kafka through kprod."""

from spark_sink.spark.messages import KProdCommitMessage, WriteSummary
from spark_sink.spark.source import KProdDataSource

__all__ = ["KProdCommitMessage", "KProdDataSource", "WriteSummary"]
