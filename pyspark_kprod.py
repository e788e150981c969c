"""Lets ``spark.read/write.format("kprod")`` work with no register call.

PySpark imports every top-level module named ``pyspark_*`` it finds on the Python path
and registers its ``DefaultSource`` under that class's ``name()``.
"""

from spark_sink.spark.source import KProdDataSource as DefaultSource

__all__ = ["DefaultSource"]
