"""A producer in a process of its own, for the SASL/GSSAPI tests (tests/producer/test_kerberos.py).

The system's Kerberos reads krb5.conf from KRB5_CONFIG, which the test sets for this
process only (the test's own process, and kprod, change no environment variable). Reads
a JSON list from standard input, one run per item: ``config`` (the producer's settings),
``topic`` and ``count``. Each run sends ``count`` records; the process prints one JSON
line, a list with per run ``{"offsets": [...]}`` or ``{"error": class name, "message":
..., "seconds": time until the error}``, and ``"env_unchanged"``: whether every KRB5*
variable is as it was before the producer.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _krb5_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("KRB5")}


def run(request: dict) -> dict[str, object]:
    """One producer, as the request says."""
    before = _krb5_env()
    started = time.monotonic()
    result: dict[str, object]
    try:
        from spark_sink.producer import KafkaProducer, ProducerRecord

        with KafkaProducer(request["config"]) as producer:
            futures = [producer.send(ProducerRecord(request["topic"], b"krb-%d" % i))
                       for i in range(request["count"])]
            result = {"offsets": [f.result(60).offset for f in futures]}
    except Exception as exc:
        result = {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - started}
    result["env_unchanged"] = _krb5_env() == before
    return result


def main() -> None:
    print(json.dumps([run(request) for request in json.load(sys.stdin)]), flush=True)


if __name__ == "__main__":
    main()
