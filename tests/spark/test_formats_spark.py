"""kprod's Avro bodies (spark_sink/encoder/formats.py) against Spark's own: for the same
DataFrame, ``to_avro`` of spark-avro (the running Spark's, from Maven Central, on the
shared session) writes exactly the bytes AvroEncoder writes from the column's Arrow form,
with the schema Spark derives (which avro_schema_for must give) and with a given one."""

from __future__ import annotations

import datetime
import decimal
import json
import random
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from spark_sink.encoder.formats import AvroEncoder, avro_schema_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType, StructType

UTC = datetime.UTC


def _spark_types() -> StructType:
    from pyspark.sql import types as T

    nested = T.StructType([
        T.StructField("x", T.IntegerType()),
        T.StructField("tags", T.ArrayType(T.StructType([T.StructField("z", T.StringType()),
                                                        T.StructField("price", T.DecimalType(5, 2))]))),
        T.StructField("when", T.DateType(), False)])
    return T.StructType([
        T.StructField("b", T.BooleanType()), T.StructField("i8", T.ByteType()), T.StructField("i16", T.ShortType()),
        T.StructField("i32", T.IntegerType()), T.StructField("i64", T.LongType(), False),
        T.StructField("f32", T.FloatType()), T.StructField("f64", T.DoubleType()),
        T.StructField("s", T.StringType()), T.StructField("bin", T.BinaryType()),
        T.StructField("d", T.DecimalType(10, 2)), T.StructField("d38", T.DecimalType(38, 6)),
        T.StructField("dt", T.DateType()), T.StructField("ts", T.TimestampType()),
        T.StructField("ntz", T.TimestampNTZType()),
        T.StructField("ints", T.ArrayType(T.IntegerType())),
        T.StructField("strings", T.ArrayType(T.StringType(), False)),
        T.StructField("m", T.MapType(T.StringType(), T.LongType())),
        T.StructField("labels", T.MapType(T.StringType(), T.StringType(), False)),
        # non-nullable: PySpark's toArrow refuses a null struct holding a non-nullable field
        T.StructField("nested", nested, False),
    ])


def _row(rng: random.Random, nulls: float) -> tuple[object, ...]:
    def maybe(value: object) -> object:
        return None if rng.random() < nulls else value

    def text() -> str:
        return "".join(rng.choice("aZé€\U0001f600\"\\\n 0") for _ in range(rng.randrange(12)))

    def dec(precision: int, scale: int) -> decimal.Decimal:
        return decimal.Decimal(f"{rng.randrange(-10 ** precision + 1, 10 ** precision)}E-{scale}")

    micros = rng.randrange(-6 * 10 ** 16, 2 * 10 ** 17)  # years 69 to 8307
    when = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=micros)
    return (
        maybe(rng.random() < 0.5), maybe(rng.randrange(-128, 128)), maybe(rng.randrange(-2 ** 15, 2 ** 15)),
        maybe(rng.randrange(-2 ** 31, 2 ** 31)), rng.randrange(-2 ** 63, 2 ** 63),
        maybe(rng.choice([0.0, -0.0, 1.5, float("inf"), float("nan"), rng.uniform(-1e30, 1e30)])),
        maybe(rng.choice([0.0, -0.0, float("-inf"), float("nan"), rng.uniform(-1e300, 1e300)])),
        maybe(text()), maybe(rng.randbytes(rng.randrange(10))), maybe(dec(10, 2)), maybe(dec(38, 6)),
        maybe(datetime.date.fromordinal(rng.randrange(1, 3_000_000))), maybe(when.replace(tzinfo=UTC)),
        maybe(when),
        maybe([maybe(rng.randrange(-1000, 1000)) for _ in range(rng.randrange(4))]),
        maybe([text() for _ in range(rng.randrange(4))]),
        # many keys: the order Java's HashMap gives them (and its resizes) is seen
        maybe({text() + str(k): maybe(rng.randrange(-10 ** 12, 10 ** 12)) for k in range(rng.randrange(30))}),
        maybe({text(): text() for _ in range(rng.randrange(5))}),
        (maybe(rng.randrange(100)), maybe([maybe((maybe(text()), maybe(dec(5, 2)))) for _ in range(rng.randrange(3))]),
         datetime.date.fromordinal(rng.randrange(1, 3_000_000))),
    )


# The value column's Spark type, Spark's derived Avro schema, the given schema (as JSON
# data), and a table of the value column with to_avro's bodies for both schemas.
Frame = tuple["DataType", Any, Any, pa.Table]


@pytest.fixture(scope="module")
def frame(spark: SparkSession) -> Frame:
    """Spark's to_avro bodies (with the derived schema and with a given one) beside the
    value column they came from, as Arrow."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    schema = _spark_types()
    rng = random.Random(52)
    rows = [_row(rng, 0.0), _row(rng, 1.0)] + [_row(rng, 0.2) for _ in range(300)]
    df = spark.createDataFrame(rows, schema).select(F.struct(*schema.names).alias("value"))
    value_type = df.schema["value"].dataType
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # None only once the session is stopped
    spark_schema = json.loads(jvm.org.apache.spark.sql.avro.SchemaConverters.toAvroType(
        df._jdf.schema().apply("value").dataType(), False, "topLevelRecord", "").toString())
    given = _null_first_bytes_decimals(spark_schema)
    table = df.select("value", to_avro("value").alias("derived"),
                      to_avro("value", json.dumps(given)).alias("given")).toArrow()
    return value_type, spark_schema, given, table


def _null_first_bytes_decimals(schema: Any) -> Any:
    """The schema with unions null-first and decimals as bytes: a given schema's other forms."""
    if isinstance(schema, list):
        return sorted((_null_first_bytes_decimals(s) for s in schema), key=lambda s: s != "null")
    if isinstance(schema, dict):
        if schema.get("logicalType") == "decimal":
            return {"type": "bytes", "logicalType": "decimal", "precision": schema["precision"],
                    "scale": schema["scale"]}
        return {k: _null_first_bytes_decimals(v) for k, v in schema.items()}
    return schema


def test_the_derived_schema_is_sparks(frame: Frame) -> None:
    _, spark_schema, _, table = frame
    assert avro_schema_for(table.schema.field("value").type) == spark_schema


def test_the_bodies_are_sparks_to_avro_bytes(frame: Frame) -> None:
    _, spark_schema, given, table = frame
    value = table.column("value")
    ours = AvroEncoder(None, value.type).encode(value).to_pylist()
    assert ours == table.column("derived").to_pylist()
    assert ours == AvroEncoder(json.dumps(spark_schema), value.type).encode(value).to_pylist()
    assert AvroEncoder(given, value.type).encode(value).to_pylist() == table.column("given").to_pylist()
