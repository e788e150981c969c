"""The protocol codec's hot paths, timed: a Produce request encoded (12 partitions, record
batches passed through), its response decoded, and a Metadata response of 200 partitions
decoded (the generic codec).

    python bench/bench_codec.py [--against CHECKOUT] [--rounds 5]

With ``--against`` (another checkout of kprod, e.g. a ``git worktree`` of an earlier
commit) the same timings of that checkout run alternately with this one's, each round in
a fresh ``python -S`` process that imports only its own ``spark_sink/protocol`` (standard
library only), and the best of each is printed with the ratio. Checkouts from before
kmsg.py (dict bodies) are timed with dict bodies of the same shape.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import timeit
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_TOPICS, _PARTITIONS = 2, 6
_PAYLOAD = (b"h" * 61, b"x" * 16000)  # a batch header and its records, as the sender passes them


def _bodies():
    """(Produce request, Produce response, Metadata response) for the checkout imported."""
    try:
        from spark_sink.protocol import apis as messages
    except ImportError:  # a checkout from before protocol/messages.py was renamed
        from spark_sink.protocol import messages  # type: ignore[no-redef]

    if not hasattr(messages, "VERSIONS"):  # before kmsg.py: dict bodies
        request = {"transactional_id": None, "acks": -1, "timeout_ms": 30000, "topic_data": [
            {"name": f"topic-{t}", "partition_data": [{"index": p, "records": _PAYLOAD} for p in range(_PARTITIONS)]}
            for t in range(_TOPICS)]}
        response = {"responses": [{"name": f"topic-{t}", "partition_responses": [
            {"index": p, "error_code": 0, "base_offset": 1000 * p, "log_append_time_ms": -1, "log_start_offset": 0,
             "record_errors": [], "error_message": None} for p in range(_PARTITIONS)]} for t in range(_TOPICS)],
            "throttle_time_ms": 0}
        metadata = {"brokers": [{"node_id": i, "host": "localhost", "port": 9092, "rack": None} for i in range(3)],
                    "topics": [{"error_code": 0, "name": f"t{t}", "is_internal": False, "partitions": [
                        {"error_code": 0, "partition_index": p, "leader_id": p % 3, "leader_epoch": 1,
                         "replica_nodes": [0, 1, 2], "isr_nodes": [0, 1, 2], "offline_replicas": []}
                        for p in range(50)]} for t in range(4)]}
        return request, response, metadata
    from spark_sink.protocol import kmsg as k

    request = k.ProduceRequest(None, -1, 30000, [
        k.TopicProduceData(f"topic-{t}", [k.PartitionProduceData(p, _PAYLOAD) for p in range(_PARTITIONS)])
        for t in range(_TOPICS)])
    response = k.ProduceResponse([k.TopicProduceResponse(f"topic-{t}", [
        k.PartitionProduceResponse(p, 0, 1000 * p, -1, 0) for p in range(_PARTITIONS)]) for t in range(_TOPICS)])
    metadata = k.MetadataResponse(
        brokers=[k.MetadataResponseBroker(i, "localhost", 9092, None) for i in range(3)],
        topics=[k.MetadataResponseTopic(0, f"t{t}", partitions=[
            k.MetadataResponsePartition(0, p, p % 3, 1, [0, 1, 2], [0, 1, 2]) for p in range(50)]) for t in range(4)])
    return request, response, metadata


def measure() -> dict[str, float]:
    """Best-of-7 microseconds per call of each path, for the checkout on sys.path."""
    try:
        from spark_sink.protocol import apis as messages
    except ImportError:  # a checkout from before protocol/messages.py was renamed
        from spark_sink.protocol import messages  # type: ignore[no-redef]
    ApiKey, decode_response_body = messages.ApiKey, messages.decode_response_body
    encode_request_parts, encode_response_body = messages.encode_request_parts, messages.encode_response_body

    request, response, metadata = _bodies()
    produce_data = encode_response_body(ApiKey.PRODUCE, 11, response)
    metadata_data = encode_response_body(ApiKey.METADATA, 12, metadata)

    def best(fn, number: int) -> float:
        return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6

    return {
        "produce request encode v11": best(lambda: encode_request_parts(ApiKey.PRODUCE, 11, request), 5000),
        "produce response decode v11": best(lambda: decode_response_body(ApiKey.PRODUCE, 11, produce_data), 5000),
        "metadata response decode v12": best(lambda: decode_response_body(ApiKey.METADATA, 12, metadata_data), 50),
    }


def _run(checkout: Path) -> dict[str, float]:
    code = (f"import sys; sys.path.insert(0, {str(checkout)!r}); sys.path.insert(0, {str(_ROOT / 'bench')!r}); "
            "import json, bench_codec; print(json.dumps(bench_codec.measure()))")
    out = subprocess.run([sys.executable, "-S", "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, help="another checkout of kprod to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sides = {"this": _ROOT} | ({"against": args.against.resolve()} if args.against else {})
    best: dict[str, dict[str, float]] = {name: {} for name in sides}
    for _ in range(args.rounds):
        for name, checkout in sides.items():
            for path, us in _run(checkout).items():
                best[name][path] = min(us, best[name].get(path, us))
    for path, us in best["this"].items():
        line = f"{path:32s} {us:9.2f} us"
        if args.against:
            line += f"   against: {best['against'][path]:9.2f} us   ratio this/against {us / best['against'][path]:.3f}"
        print(line)


if __name__ == "__main__":
    main()
