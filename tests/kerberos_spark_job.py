"""format("kprod") writes in a Spark application of their own, for the Spark SASL/GSSAPI
test (tests/spark/test_kerberos_sink.py): the system's Kerberos in the driver and in
Spark's Python workers reads krb5.conf from KRB5_CONFIG, which the test sets for this
process (and so its workers) only.

Reads a JSON list from standard input, one write per item: ``rows`` and ``options`` (the
writer's options). Prints one JSON line, a list with per write ``{"ok": true}`` or
``{"error": the line of Spark's error text that holds kprod's error}``, each with
``"seconds"``.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    from pyspark.sql import SparkSession

    requests = json.load(sys.stdin)
    spark = (SparkSession.builder.master("local[1]").appName("kprod-kerberos")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    for request in requests:
        df = spark.range(request["rows"]).selectExpr("CAST(id AS STRING) AS value")
        started = time.monotonic()
        try:
            df.write.format("kprod").options(**request["options"]).mode("append").save()
            result: dict[str, object] = {"ok": True}
        except Exception as exc:
            lines = str(exc).splitlines()
            result = {"error": next((line for line in lines if line.startswith("spark_sink.")), str(exc)[-2000:])}
        result["seconds"] = time.monotonic() - started
        results.append(result)
    spark.stop()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
