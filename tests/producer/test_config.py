"""ProducerConfig: Java names and defaults, one clear ConfigError per bad key."""

import pytest

from spark_sink.client.errors import ConfigError
from spark_sink.producer.config import ProducerConfig

BOOT = {"bootstrap.servers": "127.0.0.1:9092"}


def test_java_defaults() -> None:
    c = ProducerConfig.from_dict(BOOT)
    assert c.bootstrap_servers == (("127.0.0.1", 9092),)
    assert (c.acks, c.linger_ms, c.batch_size, c.buffer_memory) == (-1, 5, 16384, 32 * 1024 * 1024)
    assert (c.max_block_ms, c.max_request_size, c.request_timeout_ms, c.delivery_timeout_ms) == (
        60000, 1048576, 30000, 120000)
    assert c.max_in_flight_requests_per_connection == 5
    assert c.enable_idempotence is True
    assert c.compression_type == "none" and c.compression_codec == 0


def test_values_parse_from_strings_as_spark_options_do() -> None:
    c = ProducerConfig.from_dict({**BOOT, "acks": "1", "linger.ms": "20", "enable.idempotence": "false",
                                  "compression.type": "ZSTD", "bootstrap.servers": "a:1, b:2"})
    assert (c.acks, c.linger_ms, c.enable_idempotence, c.compression_codec) == (1, 20, False, 4)
    assert c.bootstrap_servers == (("a", 1), ("b", 2))


@pytest.mark.parametrize(
    "settings, named",
    [
        ({}, "bootstrap.servers"),
        ({"bootstrap.servers": "nohostport"}, "bootstrap.servers"),
        ({**BOOT, "linger.msec": 1}, "linger.msec"),
        ({**BOOT, "acks": "2"}, "acks"),
        ({**BOOT, "batch.size": "big"}, "batch.size"),
        ({**BOOT, "batch.size": -1}, "batch.size"),
        ({**BOOT, "compression.type": "brotli"}, "compression.type"),
        ({**BOOT, "compression.gzip.level": 0}, "compression.gzip.level"),
        ({**BOOT, "compression.lz4.level": 18}, "compression.lz4.level"),
        ({**BOOT, "compression.zstd.level": "fast"}, "compression.zstd.level"),
        ({**BOOT, "enable.idempotence": "maybe"}, "enable.idempotence"),
        ({**BOOT, "enable.idempotence": True, "acks": 1}, "enable.idempotence"),
        ({**BOOT, "delivery.timeout.ms": 1000}, "delivery.timeout.ms"),
        ({**BOOT, "key.serializer": "str"}, "key.serializer"),
    ],
)
def test_bad_config_names_the_key(settings: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        ProducerConfig.from_dict(settings)


def test_compression_levels_are_java_s() -> None:
    c = ProducerConfig.from_dict(BOOT)
    assert (c.compression_gzip_level, c.compression_lz4_level, c.compression_zstd_level) == (-1, 9, 3)
    assert c.compression_level is None
    c = ProducerConfig.from_dict({**BOOT, "compression.type": "zstd", "compression.zstd.level": "-7"})
    assert c.compression_level == -7
    assert ProducerConfig.from_dict({**BOOT, "compression.type": "snappy"}).compression_level is None
    assert ProducerConfig.from_dict({**BOOT, "compression.type": "lz4", "compression.lz4.level": 12}).compression_level == 12


def test_idempotence_left_default_is_dropped_when_incompatible() -> None:
    assert ProducerConfig.from_dict({**BOOT, "acks": 1}).enable_idempotence is False
    assert ProducerConfig.from_dict({**BOOT, "max.in.flight.requests.per.connection": 10}).enable_idempotence is False


def test_the_client_settings_stand_alone_and_the_producers_extend_them() -> None:
    from spark_sink.client.config import ClientConfig

    producer = ProducerConfig.from_dict({"bootstrap.servers": "h:1", "linger.ms": 7, "request.timeout.ms": 900})
    assert isinstance(producer, ClientConfig) and ClientConfig.of(producer) is producer
    # A mapping of a producer's settings: the client keeps its own, checked as the producer would.
    client = ClientConfig.of({"bootstrap.servers": "h:1", "linger.ms": 7, "request.timeout.ms": 900})
    assert type(client) is ClientConfig and client.request_timeout_ms == 900 and not hasattr(client, "linger_ms")
    with pytest.raises(ConfigError, match="request.timeout.ms"):
        ClientConfig.of({"bootstrap.servers": "h:1", "request.timeout.ms": -1})
    with pytest.raises(ConfigError, match="unknown client config key.*linger.ms"):
        ClientConfig.from_dict({"bootstrap.servers": "h:1", "linger.ms": 7})
