"""The ``kprod`` Spark data source: batch and streaming writes to Kafka through kprod.

Names are imported on first use, as in ``spark_sink``: finding the data source imports
only :mod:`spark_sink.spark.source`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_sink._exports import lazy_exports

_EXPORTS = {
    "KProdCommitMessage": "spark_sink.spark.task_reports",
    "WriteSummary": "spark_sink.spark.task_reports",
    "KProdDataSource": "spark_sink.spark.source",
    "use_session_in_this_thread": "spark_sink.spark.threads",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from spark_sink.spark.source import KProdDataSource
    from spark_sink.spark.task_reports import KProdCommitMessage, WriteSummary
    from spark_sink.spark.threads import use_session_in_this_thread
