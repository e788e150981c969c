"""The ``kprod`` Spark data source: batch and streaming writes to Kafka through kprod.

Names are imported on first use, as in ``spark_sink``: finding the data source imports
only :mod:`spark_sink.spark.source`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "KProdCommitMessage": "spark_sink.spark.messages",
    "WriteSummary": "spark_sink.spark.messages",
    "KProdDataSource": "spark_sink.spark.source",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spark_sink.spark' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(module), name)
    return value


if TYPE_CHECKING:
    from spark_sink.spark.messages import KProdCommitMessage, WriteSummary
    from spark_sink.spark.source import KProdDataSource
