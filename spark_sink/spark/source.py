"""``KProdDataSource``: the ``kprod`` format for batch and streaming writes to Kafka.

Spark's planner workers import this module to find and create the data source, each in a
fresh Python process: it imports the producer only once a writer is asked for.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from spark_sink.spark.driver_check import short_traceback

UNSUPPORTED_OVERWRITE = (
    "save mode 'overwrite' is not supported by kprod: a Kafka topic is append-only and cannot "
    "be truncated. The accepted save mode is 'append': use .mode('append'). (A write without "
    ".mode() is refused by Spark itself for Python data sources, with UNSUPPORTED_DATA_SOURCE_SAVE_MODE "
    "suggesting Append or Overwrite; Spark's Kafka sink took it as append.)"
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
            from spark_sink.producer import ConfigError

            raise ConfigError(UNSUPPORTED_OVERWRITE)
        from spark_sink.spark.writer import KProdBatchWriter, plan_write

        return KProdBatchWriter(*plan_write(self.options, schema))

    @short_traceback
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Complete mode asks to overwrite; like Spark's Kafka sink, every microbatch's
        # full result is simply appended to the topic.
        from spark_sink.spark.writer import KProdStreamWriter, plan_write

        return KProdStreamWriter(*plan_write(self.options, schema, streaming=True, check=not self.__dict__.get(
            "_pickled", False)))

    def __getstate__(self) -> dict:
        # Spark plans each microbatch's write on an instance it makes anew from the class,
        # and pickles the instance made at the query's start only for its commit runner,
        # which asks for a writer again to commit or abort: that one needs no cluster check.
        return {**self.__dict__, "_pickled": True}
