"""``KProdDataSource``: the ``kprod`` format for batch and streaming writes to Kafka."""

from __future__ import annotations

import logging

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from spark_sink.producer import ConfigError
from spark_sink.spark.columns import plan_columns
from spark_sink.spark.driver_check import check_write, short_traceback
from spark_sink.spark.options import parse_options
from spark_sink.spark.writer import KProdBatchWriter, KProdStreamWriter

log = logging.getLogger(__name__)

UNSUPPORTED_OVERWRITE = (
    "save mode 'overwrite' is not supported by kprod: a Kafka topic is append-only and cannot "
    "be truncated. The accepted save mode is 'append': use .mode('append'). ('errorifexists', "
    "Spark's default, and 'ignore' are refused by Spark itself for Python data sources.)"
)


class KProdDataSource(DataSource):
    """Writes a DataFrame's rows to Kafka as records, through kprod's columnar producer.

    ``df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", ...)
    .option("topic", ...).save()`` or ``df.writeStream.format("kprod")...``. Options,
    columns and the cluster (reachable, authenticated, the topic there) are checked here,
    on the driver, before any task sends a record.
    """

    @classmethod
    def name(cls) -> str:
        return "kprod"

    @short_traceback
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        # Spark hands a Python data source only two save modes: append (overwrite=False) and
        # overwrite (True). It refuses 'errorifexists' (its default) and 'ignore' itself,
        # with UNSUPPORTED_DATA_SOURCE_SAVE_MODE, before this method runs.
        if overwrite:
            raise ConfigError(UNSUPPORTED_OVERWRITE)
        options = parse_options(self.options)
        plan = plan_columns(schema, options.topic)
        check_write(options)
        return KProdBatchWriter(options, plan)

    @short_traceback
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802 (Spark's name)
        # Complete mode asks to overwrite; like Spark's Kafka sink, every microbatch's
        # full result is simply appended to the topic.
        options = parse_options(self.options, streaming=True)
        plan = plan_columns(schema, options.topic)
        check_write(options)
        return KProdStreamWriter(options, plan)
