"""Options of the ``kprod`` data source, parsed and checked on the driver.

They follow Spark's own Kafka sink: ``kafka.bootstrap.servers`` (required), ``topic``
(default topic) and any ``kafka.<java producer key>`` passed to the producer with the
prefix removed. Options of our own start with ``kprod.``.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_sink.producer import CONFIG_KEYS as PRODUCER_KEYS
from spark_sink.producer import ConfigError, ProducerConfig, idempotence_conflicts
from spark_sink.spark.formats import FORMAT_OPTIONS, ColumnFormats, is_format_option, parse_formats

log = logging.getLogger(__name__)

KAFKA_PREFIX = "kafka."

# Our own options (lower case, as Spark hands them over), with their documentation.
SINK_OPTIONS: dict[str, str] = {
    "kprod.deliveryreport.path": (
        "kprod.deliveryReport.path: a file on the driver; each committed microbatch (or batch "
        "write) appends one JSON line with batchId, records, bytes and per topic-partition "
        "offset ranges"
    ),
    "kprod.producer.cache.timeout": (
        "kprod.producer.cache.timeout: how long a producer a task left behind (flushed) is kept "
        "in its Python worker for later tasks with the same settings; a duration such as 10m, "
        "30s or 500ms, plain numbers are milliseconds, 0 closes each producer with its task "
        "(default: 10m, as spark.kafka.producer.cache.timeout)"
    ),
    "kprod.deliveryguarantee": (
        "kprod.deliveryGuarantee: at-least-once (default) or exactly-once: each task writes its "
        "rows in one Kafka transaction that the driver commits with the microbatch (or the batch "
        "write); read them with isolation.level=read_committed"
    ),
    "kprod.transactionalidprefix": (
        "kprod.transactionalIdPrefix: exactly-once only; task N uses the transactional id "
        "<prefix>-N. Keep it stable across restarts of a query and unique to it (default: derived "
        "from the streaming query's id, which its checkpoint keeps; a new one per batch write). On a "
        "batch write it names the write: a rerun under the same name commits only what was not "
        "committed"
    ),
    "kprod.missingmarkers": (
        "kprod.missingMarkers: exactly-once streaming and named batch writes; fail (default) or ignore. A "
        "query restarted from a checkpoint (or a named write run again) whose markers are gone (Kafka keeps "
        "them offsets.retention.minutes after the last commit) fails with an error, since a commit that "
        "did not end could be written twice; ignore starts afresh (for the first run after a clean stop)"
    ),
    "kprod.replaymatch": (
        "kprod.replayMatch: exactly-once streaming only; rows (default) or tasks. How a microbatch "
        "replayed after a driver crash finds the tasks an earlier run committed: by task number and "
        "rows digest (a task whose rows moved to another task is told apart), or by task number "
        "alone (for queries whose rows differ between runs, as values computed with uuid(), rand() "
        "or current_timestamp() do)"
    ),
    "kprod.markertopic": (
        "kprod.markerTopic: exactly-once only; an existing topic whose partition 0 holds the "
        "committed-microbatch markers, as offsets of consumer groups <prefix>-N (default: the "
        "'topic' option)"
    ),
    "kprod.clustercheck": (
        "kprod.clusterCheck: true (default) or false; before any task runs, the driver asks the "
        "cluster once whether it can be reached and authenticated with and whether the topic "
        "exists, and fails the write with that error; false skips it (a driver that cannot reach "
        "the brokers its executors reach)"
    ),
    "kprod.errors.tolerance": (
        "kprod.errors.tolerance: none (default) or all. none: a row with an error of its own fails its "
        "task, as ever; all: such rows (too large for max.request.size, a topic column naming a topic "
        "that is missing, invalid or that the principal may not describe, a null topic with no "
        "'topic' option, a partition the topic lacks) are left out and counted, and written to "
        "kprod.errors.deadLetterTopic if set. Errors of the cluster or the connection fail the task either way"
    ),
    "kprod.errors.deadlettertopic": (
        "kprod.errors.deadLetterTopic: with kprod.errors.tolerance=all, an existing topic that gets "
        "each refused row's key and value with kprod.errors.* headers naming the reason (under "
        "exactly-once, in the task's transaction); without it refused rows are dropped and counted"
    ),
    "kprod.errors.maxratio": (
        "kprod.errors.maxRatio: with kprod.errors.tolerance=all, a fraction from 0 to 1: a write or "
        "microbatch whose refused rows are more than this fraction of its rows fails, naming the "
        "ratio and the most common reason (default: none)"
    ),
    "kprod.flush.timeout.ms": (
        "kprod.flush.timeout.ms: longest a task waits for its records to be acknowledged after "
        "its last batch (default: kafka.delivery.timeout.ms plus 30000)"
    ),
}

# Producer defaults the sink changes (a kafka.* option still wins). A task hands the
# producer whole Arrow batches, thousands of rows per partition at once: Java's 16 KiB
# batch.size would cut them into many small requests; 1 MB batches (still under the
# broker's default message.max.bytes and the default max.request.size) go much faster.
SINK_PRODUCER_DEFAULTS: dict[str, str] = {"batch.size": "1000000"}

# Spark's Kafka sink refuses these too: the sink hands the producer bytes, not objects.
_REFUSED_PRODUCER_KEYS: dict[str, str] = {
    "key.serializer": "keys are sent as the bytes of the 'key' column; cast it to binary or string in Spark",
    "value.serializer": "values are sent as the bytes of the 'value' column; cast it to binary or string in Spark",
    "interceptors": "interceptors are Python objects and cannot be given as a Spark option",
    "interceptor.classes": ("Java interceptors may change or drop records and kprod runs no Java classes; "
                            "transform the DataFrame in Spark instead"),
    "transactional.id": ("set kprod.deliveryGuarantee=exactly-once instead: each task then gets its own "
                         "transactional id, kprod.transactionalIdPrefix-<partition>"),
}

# Keys of Java's ProducerConfig (Kafka 4.3) that kprod does not implement because they
# configure the JVM client itself (its classes, metrics, JCA providers, Kerberos login):
# accepted, as a job written for format("kafka") sets them, and named in one warning on
# the driver with what kprod does instead. A key kprod implements is not looked up here
# (PRODUCER_KEYS wins), so a key the producer learns later simply stops being listed.
JVM_ONLY_KEYS: dict[str, str] = {
    "client.dns.lookup": ("kprod tries each address a host resolves to in turn, as use_all_dns_ips "
                          "(the Java default) does"),
    "config.providers": "kprod resolves no ${provider:...} references; pass the values themselves",
    "enable.metrics.push": "kprod pushes no client metrics to the broker (KIP-714); see producer.metrics()",
    "metric.reporters": "kprod's metrics are producer.metrics() and each write's summary line, no JMX",
    "metrics.num.samples": "kprod's rates are always over 2 samples",
    "metrics.sample.window.ms": "kprod's rates are always over 30 s samples",
    "metrics.recording.level": "kprod records the same metrics at every level",
    "metadata.recovery.strategy": "kprod always falls back to the bootstrap addresses when no known broker answers",
    "metadata.recovery.rebootstrap.trigger.ms": "kprod always falls back to the bootstrap addresses when no "
                                                "known broker answers",
    "socket.connection.setup.timeout.max.ms": "kprod waits socket.connection.setup.timeout.ms for every attempt",
    "security.providers": "kprod uses Python's ssl module (OpenSSL), no JCA providers",
    "ssl.provider": "kprod uses Python's ssl module (OpenSSL)",
    "ssl.protocol": "kprod negotiates TLS 1.2 or 1.3 with OpenSSL's defaults",
    "ssl.enabled.protocols": "kprod negotiates TLS 1.2 or 1.3 with OpenSSL's defaults",
    "ssl.cipher.suites": "kprod uses OpenSSL's default cipher suites",
    "ssl.keymanager.algorithm": "kprod reads the key from ssl.keystore.location",
    "ssl.trustmanager.algorithm": "kprod checks certificates with OpenSSL against the truststore",
    "ssl.secure.random.implementation": "kprod uses OpenSSL's random numbers",
    "ssl.engine.factory.class": "kprod builds its TLS context from the ssl.* settings",
    "ssl.keystore.key": "kprod reads the client key from ssl.keystore.location (a JKS, PKCS12 or PEM file)",
    "ssl.keystore.certificate.chain": "kprod reads the client certificate from ssl.keystore.location",
    "sasl.client.callback.handler.class": "kprod runs no Java callback handler; it reads credentials from "
                                          "sasl.jaas.config",
    "sasl.login.class": "kprod runs no Java login class; it logs in with sasl.jaas.config",
    "sasl.kerberos.kinit.cmd": "kprod runs no kinit; it logs in from the keyTab of sasl.jaas.config or the ticket cache",
    "sasl.kerberos.min.time.before.relogin": "the system's GSSAPI renews tickets from the keytab when they expire",
    "sasl.kerberos.ticket.renew.jitter": "the system's GSSAPI renews tickets from the keytab when they expire",
    "sasl.kerberos.ticket.renew.window.factor": "the system's GSSAPI renews tickets from the keytab when they expire",
    "sasl.oauthbearer.jwt.retriever.class": "kprod gets tokens from sasl.oauthbearer.token.endpoint.url or "
                                            "sasl.oauthbearer.token.provider",
    "sasl.oauthbearer.jwt.validator.class": "kprod does not validate its own tokens; the broker does",
    "sasl.oauthbearer.client.credentials.client.id": "kprod reads clientId from sasl.jaas.config",
    "sasl.oauthbearer.client.credentials.client.secret": "kprod reads clientSecret from sasl.jaas.config",
    "sasl.oauthbearer.scope": "kprod reads scope from sasl.jaas.config",
    "sasl.oauthbearer.assertion.algorithm": "kprod does not sign JWT assertions; it uses client credentials",
    "sasl.oauthbearer.assertion.claim.aud": "kprod does not sign JWT assertions; it uses client credentials",
    "sasl.oauthbearer.assertion.claim.exp.seconds": "kprod does not sign JWT assertions; it uses client credentials",
    "sasl.oauthbearer.assertion.claim.iss": "kprod does not sign JWT assertions; it uses client credentials",
    "sasl.oauthbearer.assertion.claim.jti.include": "kprod does not sign JWT assertions; it uses client credentials",
    "sasl.oauthbearer.assertion.claim.nbf.seconds": "kprod does not sign JWT assertions; it uses client credentials",
    "sasl.oauthbearer.assertion.claim.sub": "kprod does not sign JWT assertions; it uses client credentials",
    "sasl.oauthbearer.assertion.file": "kprod does not send JWT assertions; it uses client credentials",
    "sasl.oauthbearer.assertion.private.key.file": "kprod does not sign JWT assertions; it uses client credentials",
    "sasl.oauthbearer.assertion.private.key.passphrase": "kprod does not sign JWT assertions",
    "sasl.oauthbearer.assertion.template.file": "kprod does not sign JWT assertions; it uses client credentials",
    "sasl.oauthbearer.clock.skew.seconds": "kprod does not validate its own tokens; the broker does",
    "sasl.oauthbearer.expected.audience": "kprod does not validate its own tokens; the broker does",
    "sasl.oauthbearer.expected.issuer": "kprod does not validate its own tokens; the broker does",
    "sasl.oauthbearer.jwks.endpoint.url": "kprod does not validate its own tokens; the broker does",
    "sasl.oauthbearer.jwks.endpoint.refresh.ms": "kprod does not validate its own tokens; the broker does",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms": "kprod does not validate its own tokens; the broker does",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms": "kprod does not validate its own tokens; the broker does",
    "transaction.two.phase.commit.enable": "kprod.deliveryGuarantee=exactly-once prepares each task's transaction "
                                           "and the driver commits them",
    # Gone from Kafka's ProducerConfig, still in old jobs (and in Spark's own sink tests).
    "block.on.buffer.full": "send() waits up to max.block.ms for buffer.memory, as Java since 0.9",
}

# Options of Spark's Kafka source that jobs copy into their writes: Spark's sink ignores
# them, and so does kprod (headers are written whenever there is a 'headers' column).
_SPARK_KAFKA_READ_OPTIONS = frozenset({
    "includeheaders", "subscribe", "subscribepattern", "assign", "startingoffsets", "endingoffsets",
    "startingtimestamp", "endingtimestamp", "startingoffsetsbytimestamp", "endingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy", "failondataloss", "maxoffsetspertrigger", "minoffsetspertrigger",
    "maxtriggerdelay", "minpartitions", "maxrecordsperpartition", "groupidprefix", "kafkaconsumer.polltimeoutms",
    "fetchoffset.numretries", "fetchoffset.retryintervalms",
})

# Options Spark itself may put into the map of every sink; they are not ours to check.
_SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """The checked options of one write: producer settings plus the sink's own."""

    producer_config: dict[str, str] = field(hash=False)
    topic: str | None
    delivery_report_path: str | None
    flush_timeout_s: float
    producer_cache_timeout_s: float
    buffer_memory: int  # the producer's buffer.memory, which bounds a send's size
    exactly_once: ExactlyOnce | None
    check_timeout_ms: int  # the driver's check of the cluster: its bound, 0 for no check
    formats: ColumnFormats | None = None  # the key's and value's formats (None: both binary)
    errors: ErrorTolerance | None = None  # kprod.errors.tolerance=all; None: none


@dataclass(frozen=True, slots=True)
class ErrorTolerance:
    """kprod.errors.tolerance=all: rows with errors of their own are refused, counted and
    written to ``dead_letter_topic`` (if any); more than ``max_ratio`` of a write's rows
    refused fails it."""

    dead_letter_topic: str | None = None
    max_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class ExactlyOnce:
    """Settings of exactly-once writes: task N's transactional id is ``<prefix>-N``, and its
    committed microbatches are marked under the group of the same name on
    ``(marker_topic, 0)``."""

    prefix: str | None  # None: derived from the streaming query's id (see prefix_for)
    marker_topic: str
    one_write: bool = False  # the prefix is this batch write's own: no later write uses its ids
    timeout_given: bool = False  # kafka.transaction.timeout.ms was set
    # A hash of every option (the checkpoint location among them): names the registry where
    # tasks record a prefix derived from the query id, which the driver cannot know.
    options_key: str = ""
    missing_markers: str = "fail"  # kprod.missingMarkers
    replay_match: str = "rows"  # kprod.replayMatch
    batch: bool = False  # a batch write (with a prefix of its own, or one the user named)

    def prefix_for(self, query_id: str | None) -> str:
        """The prefix of this write. Unless one was given, it comes from the streaming
        query's id, which Spark keeps in the checkpoint: the same on every restart from it,
        however its path is spelled (relative, s3a://...) and wherever the driver runs."""
        if self.prefix is not None:
            return self.prefix
        if not query_id:
            raise ConfigError("kprod.deliveryGuarantee=exactly-once: this streaming write has no query id to derive "
                              "kprod.transactionalIdPrefix from; set kprod.transactionalIdPrefix")
        return "kprod-" + hashlib.sha256(query_id.encode()).hexdigest()[:20]


def _producer_options(opts: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The producer settings among the (lower-cased) ``kafka.*`` options, with the sink's
    defaults, and the Java-only settings kprod ignores."""
    producer: dict[str, str] = {}
    jvm_only: list[str] = []
    for key, value in opts.items():
        if not key.startswith(KAFKA_PREFIX):
            continue
        name = key[len(KAFKA_PREFIX):]
        if name in _REFUSED_PRODUCER_KEYS:
            raise ConfigError(f"option {key!r} is not supported: {_REFUSED_PRODUCER_KEYS[name]}")
        if name not in PRODUCER_KEYS and name in JVM_ONLY_KEYS:
            jvm_only.append(name)
            continue
        if name not in PRODUCER_KEYS:
            raise ConfigError(
                f"option {key!r}: {name!r} is not a producer setting kprod knows; accepted "
                "kafka.* options: "
                + ", ".join(KAFKA_PREFIX + k for k in sorted(PRODUCER_KEYS) if k not in _REFUSED_PRODUCER_KEYS)
            )
        producer[name] = value
    for name, value in SINK_PRODUCER_DEFAULTS.items():
        producer.setdefault(name, value)
    return producer, jvm_only


def parse_options(options: Mapping[str, Any], streaming: bool = False) -> SinkOptions:
    """Check every option; raise ConfigError naming the option and what it accepts."""
    # Spark's options are case-insensitive and arrive lower-cased; producer keys are all lower case.
    opts = {str(k).lower(): ("" if v is None else str(v)) for k, v in options.items()}
    producer, jvm_only = _producer_options(opts)
    if not producer.get("bootstrap.servers", "").strip():
        raise ConfigError("option 'kafka.bootstrap.servers' is required (host:port[,host:port...])")
    try:
        config = ProducerConfig.from_dict(producer)
    except ConfigError as exc:
        # The producer names the Java key; the user wrote it with the kafka. prefix.
        raise ConfigError(f"option {KAFKA_PREFIX}{exc}") from None

    unknown = sorted(
        k for k in opts
        if not k.startswith(KAFKA_PREFIX) and k != "topic" and k not in SINK_OPTIONS and k not in _SPARK_OPTIONS
        and k not in _SPARK_KAFKA_READ_OPTIONS and not is_format_option(k)
    )
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(map(repr, unknown))}; kprod accepts kafka.bootstrap.servers, "
            "topic, kafka.<producer setting> and "
            + ", ".join([*(_display(k) for k in SINK_OPTIONS), *(d.split(":")[0] for d in FORMAT_OPTIONS.values())])
        )

    topic = opts.get("topic")
    if topic is not None:
        topic = topic.strip()
        if not topic:
            raise ConfigError("option 'topic' is empty; give a topic name or leave it out and add a 'topic' column")
        _check_topic_name(topic, "topic")

    report = opts.get("kprod.deliveryreport.path") or None
    flush_ms = opts.get("kprod.flush.timeout.ms")
    if flush_ms is None:
        flush_timeout_s = (config.delivery_timeout_ms + 30_000) / 1000
    else:
        try:
            flush_timeout_s = int(flush_ms) / 1000
        except ValueError:
            raise ConfigError(f"option 'kprod.flush.timeout.ms': expected an integer, got {flush_ms!r}") from None
        if flush_timeout_s <= 0:
            raise ConfigError(f"option 'kprod.flush.timeout.ms': expected a positive integer, got {flush_ms!r}")
    cache_timeout = opts.get("kprod.producer.cache.timeout")
    cache_timeout_s = 600.0 if cache_timeout is None else _duration_s("kprod.producer.cache.timeout", cache_timeout)
    exactly_once = _exactly_once(opts, topic, config, streaming)
    check = opts.get("kprod.clustercheck", "true").strip().lower()
    if check not in ("true", "false"):
        raise ConfigError(f"option 'kprod.clusterCheck': expected true or false, got {opts['kprod.clustercheck']!r}")
    check_timeout_ms = min(config.max_block_ms, CHECK_TIMEOUT_MS) if check == "true" else 0
    if jvm_only:
        _warn_jvm_only(jvm_only)
    return SinkOptions(producer, topic, report, flush_timeout_s, cache_timeout_s, config.buffer_memory,
                       exactly_once, check_timeout_ms, parse_formats(opts),
                       _error_tolerance(opts))


def _error_tolerance(opts: Mapping[str, str]) -> ErrorTolerance | None:
    tolerance = opts.get("kprod.errors.tolerance", "none").strip().lower()
    if tolerance not in ("none", "all"):
        raise ConfigError(f"option 'kprod.errors.tolerance': expected none or all, got {opts['kprod.errors.tolerance']!r}")
    if tolerance == "none":
        given = [k for k in ("kprod.errors.deadlettertopic", "kprod.errors.maxratio") if k in opts]
        if given:
            raise ConfigError(f"option {_display(given[0])!r} applies only with kprod.errors.tolerance=all")
        return None
    topic = opts.get("kprod.errors.deadlettertopic", "").strip() or None
    if topic is not None:
        _check_topic_name(topic, "kprod.errors.deadLetterTopic")
    ratio_text = opts.get("kprod.errors.maxratio", "").strip()
    ratio = None
    if ratio_text:
        try:
            ratio = float(ratio_text)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"option 'kprod.errors.maxRatio': expected a fraction from 0 to 1, got {ratio_text!r}")
    return ErrorTolerance(topic, ratio)


_GUARANTEES = ("at-least-once", "exactly-once")

# The driver's check of the cluster waits at most this long (or max.block.ms if shorter):
# time for a connection attempt that hangs (socket.connection.setup.timeout.ms, 10 s by
# default) to be reported as such.
CHECK_TIMEOUT_MS = 15_000

_SECRET_WORDS = ("password", "secret", "jaas", "token")


def _exactly_once_conflicts(opts: Mapping[str, str], config: ProducerConfig) -> list[str]:
    """The kafka.* options exactly-once cannot run with: Kafka's transactions need an
    idempotent producer, which needs acks=all, retries and at most 5 requests in flight."""
    conflicts = []
    if "kafka.enable.idempotence" in opts and not config.enable_idempotence:
        conflicts.append(f"kafka.enable.idempotence={opts['kafka.enable.idempotence']} (transactions need "
                         "an idempotent producer)")
    return conflicts + [
        f"kafka.{key}={opts['kafka.' + key]} (transactions need an idempotent producer, whose {key} {rule})"
        for key, rule in idempotence_conflicts(config.acks, config.retries,
                                               config.max_in_flight_requests_per_connection)]


def _exactly_once(opts: Mapping[str, str], topic: str | None, config: ProducerConfig,
                  streaming: bool) -> ExactlyOnce | None:
    guarantee = opts.get("kprod.deliveryguarantee", "at-least-once").strip().lower()
    if guarantee not in _GUARANTEES:
        raise ConfigError(f"option 'kprod.deliveryGuarantee': expected one of {', '.join(_GUARANTEES)}, "
                          f"got {opts['kprod.deliveryguarantee']!r}")
    eo_only = [k for k in ("kprod.transactionalidprefix", "kprod.markertopic", "kprod.missingmarkers",
                           "kprod.replaymatch") if k in opts]
    if guarantee == "at-least-once":
        if eo_only:
            raise ConfigError(f"option {_display(eo_only[0])!r} applies only with kprod.deliveryGuarantee=exactly-once")
        return None
    conflicts = _exactly_once_conflicts(opts, config)
    if conflicts:
        raise ConfigError(f"option kprod.deliveryGuarantee=exactly-once conflicts with {'; '.join(conflicts)}: "
                          "remove or change these options")
    prefix = opts.get("kprod.transactionalidprefix", "").strip() or None
    one_write = prefix is None and not streaming
    if one_write:
        # Batch writes are never replayed: a prefix of their own fences nothing else.
        prefix = "kprod-" + uuid.uuid4().hex[:20]
    marker_topic = opts.get("kprod.markertopic", "").strip() or topic
    if marker_topic is None:
        raise ConfigError("option 'kprod.markerTopic': required for exactly-once writes without a 'topic' option "
                          "(an existing topic; its partition 0 holds the committed-microbatch markers)")
    _check_topic_name(marker_topic, "kprod.markerTopic")
    missing = opts.get("kprod.missingmarkers", "fail").strip().lower()
    if missing not in ("fail", "ignore"):
        raise ConfigError(f"option 'kprod.missingMarkers': expected fail or ignore, got {opts['kprod.missingmarkers']!r}")
    replay_match = opts.get("kprod.replaymatch", "rows").strip().lower()
    if replay_match not in ("rows", "tasks"):
        raise ConfigError(f"option 'kprod.replayMatch': expected rows or tasks, got {opts['kprod.replaymatch']!r}")
    # Secrets stay out of it: they tell no two queries apart.
    named = sorted((k, v) for k, v in opts.items() if not any(w in k for w in _SECRET_WORDS))
    key = hashlib.sha256(repr(named).encode()).hexdigest()[:24]
    return ExactlyOnce(prefix, marker_topic, one_write, "kafka.transaction.timeout.ms" in opts, key, missing,
                       replay_match, batch=not streaming)


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _warn_jvm_only(names: list[str]) -> None:
    """One warning for every JVM-only key of a write (on the driver, where the options are
    first parsed), each with what kprod does instead."""
    log.warning("kprod ignores these Java producer settings: %s",
                "; ".join(f"{KAFKA_PREFIX}{name} ({JVM_ONLY_KEYS[name]})" for name in sorted(names)))


def _duration_s(option: str, text: str) -> float:
    """A Spark-style duration (``10m``, ``30s``, ``500ms``; a bare number is milliseconds)."""
    value = text.strip().lower()
    number = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(number):] or "ms"
    try:
        seconds = float(number) * _DURATION_UNITS[unit]
    except (ValueError, KeyError):
        raise ConfigError(f"option {option!r}: expected a duration such as 10m, 30s or 500ms, got {text!r}") from None
    if seconds < 0:
        raise ConfigError(f"option {option!r}: expected a duration of 0 or more, got {text!r}")
    return seconds


def _display(key: str) -> str:
    """The documented spelling of one of our (lower-cased) option names."""
    return SINK_OPTIONS[key].split(":", 1)[0]


_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _check_topic_name(topic: str, option: str) -> None:
    """Kafka's own topic name rule, so a typo fails here rather than in every task."""
    if topic in (".", "..") or len(topic) > 249 or not set(topic) <= _TOPIC_CHARS:
        raise ConfigError(
            f"option {option!r}: {topic!r} is not a valid Kafka topic name "
            "(1-249 characters of ASCII letters, digits, '.', '_' and '-', not '.' or '..')"
        )
