"""Spark writes in an application of their own, for the Spark SASL/GSSAPI test
(tests/spark/test_kerberos_sink.py): the system's Kerberos in the driver and in Spark's
Python workers reads krb5.conf from KRB5_CONFIG, which the test sets for this process
(and so its workers) only; Spark's own Kafka sink (its connector jar is on the session)
reads the same file, named to the driver's JVM as java.security.krb5.conf.

Reads a JSON list from standard input, one write per item: ``rows``, ``options`` (the
writer's options), and optionally ``format`` ("kprod" by default) and ``columns`` (SQL
expressions over ``spark.range(rows)``'s ``id``; by default the id as a string value).
Prints one JSON line, a list with per write ``{"ok": true}`` or ``{"error": the line of
Spark's error text that holds kprod's error}``, each with ``"jobs"``: how many Spark jobs
it ran (none for a write the driver's check refused).
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    from pyspark.sql import SparkSession

    from kprod_broker import spark_kafka_jars

    requests = json.load(sys.stdin)
    spark = (SparkSession.builder.master("local[1]").appName("kprod-kerberos")
             .config("spark.jars", ",".join(str(jar) for jar in spark_kafka_jars()))
             .config("spark.driver.extraJavaOptions", f"-Djava.security.krb5.conf={os.environ['KRB5_CONFIG']}")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    sc = spark.sparkContext
    for n, request in enumerate(requests):
        df = spark.range(request["rows"]).selectExpr(*request.get("columns", ["CAST(id AS STRING) AS value"]))
        sc.setJobGroup(f"write-{n}", "a write of the Kerberos test")
        try:
            df.write.format(request.get("format", "kprod")).options(**request["options"]).mode("append").save()
            result: dict[str, object] = {"ok": True}
        except Exception as exc:
            lines = str(exc).splitlines()
            result = {"error": next((line for line in lines if line.startswith("spark_sink.")), str(exc)[-2000:])}
        result["jobs"] = len(sc.statusTracker().getJobIdsForGroup(f"write-{n}"))
        results.append(result)
    spark.stop()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
