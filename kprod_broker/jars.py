"""Apache Kafka's jars (and Spark's own Kafka connector, the benchmark's peer sink) from
Maven Central, fetched with the Ivy that PySpark ships in ``pyspark/jars`` (what
``spark-submit --packages`` uses): Python and Java are all it takes.

They are fetched once into a cache outside any repository (``$KPROD_CACHE``, default
``~/.cache/kprod``): ``<name>/libs/*.jar`` per set of artifacts, Ivy's own downloads in
``ivy/``, under a file lock so that concurrent callers fetch once.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import quoteattr

KAFKA_VERSION = "4.3.1"
# The newest PySpark whose spark-sql-kafka and spark-avro are on Maven Central (the
# suite's, pinned in pyproject.toml's dev extra).
SPARK_PACKAGES_VERSION = "4.2.0"
# Kafka 4 logs through log4j 2 behind slf4j 1.7; its jars name no slf4j binding.
_LOG4J_VERSION = "2.25.4"
# Kafka 3 logs through log4j 1 (reload4j) behind slf4j 1.7, and names no binding either.
_SLF4J_RELOAD4J = "org.slf4j:slf4j-reload4j:1.7.36"
# kafka-tools (for ProducerPerformance, the Java peer of kprod-perf) depends on Kafka
# Connect's REST server (Jetty, Jersey: 40 more modules) for tools kprod never runs.
_KAFKA_EXCLUDES = ("org.apache.kafka:connect-runtime",)
_MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"


class KafkaUnavailableError(RuntimeError):
    """Kafka cannot be fetched or started here (no Java, no PySpark, no network to Maven Central)."""


def cache_dir() -> Path:
    """Where fetched jars live: ``$KPROD_CACHE`` or ``~/.cache/kprod`` (never inside a repository)."""
    return Path(os.environ.get("KPROD_CACHE") or Path.home() / ".cache" / "kprod")


def java() -> str:
    """The ``java`` to run: ``$JAVA_HOME/bin/java`` or the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not os.access(found, os.X_OK):
        raise KafkaUnavailableError(
            "Apache Kafka, Ivy and the Schema Registry need Java 17 or newer: no java on PATH and no JAVA_HOME")
    return found


def ivy_jar() -> Path:
    """The Ivy jar inside the installed PySpark (found without importing pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise KafkaUnavailableError("fetching Kafka's jars uses the Ivy that PySpark ships: "
                                    "pip install -e '.[spark]' in a clone of kprod")
    found = sorted(Path(next(iter(spec.submodule_search_locations)), "jars").glob("ivy-*.jar"))
    if not found:
        raise KafkaUnavailableError(f"no ivy-*.jar in {spec.submodule_search_locations[0]}/jars")
    return found[-1]


def maven_jars(name: str, artifacts: Sequence[str], excludes: Sequence[str] = ()) -> list[Path]:
    """The jars of ``artifacts`` (``group:artifact:version``) and their runtime dependencies,
    without the modules ``excludes`` names (``group:artifact``) and what only they need.

    Fetched into ``cache_dir()/name`` the first time; later calls only list the directory.
    """
    target = cache_dir() / name
    done = target / ".complete"
    if not done.exists():
        cache_dir().mkdir(parents=True, exist_ok=True)
        with open(cache_dir() / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one Ivy at a time: they share its cache
            if not done.exists():
                # A first fetch takes a minute or so: say why nothing else happens meanwhile.
                print(f"[kprod_broker] fetching {', '.join(artifacts)} and their dependencies from Maven "
                      f"Central into {target} (once)", file=sys.stderr, flush=True)
                target.mkdir(exist_ok=True)
                try:
                    _fetch(target, artifacts, excludes)
                except BaseException:
                    # Nothing half-fetched stays behind to be taken for a cache entry.
                    shutil.rmtree(target, ignore_errors=True)
                    raise
                done.write_text("\n".join(artifacts) + "\n")
    return sorted((target / "libs").glob("*.jar"))


def maven_archive(name: str, artifact: str, classifier: str, ext: str = "tar.gz") -> Path:
    """The directory that the archive ``artifact`` (``group:artifact:version``) with
    ``classifier`` and ``ext`` (tar.gz, zip) unpacks into, under ``cache_dir()/name``.

    Fetched and unpacked the first time, under the cache's lock; the archive itself is not
    kept (what is unpacked is all a caller runs).
    """
    target = cache_dir() / name
    done = target / ".complete"
    if not done.exists():
        cache_dir().mkdir(parents=True, exist_ok=True)
        with open(cache_dir() / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                coordinate = f"{artifact}:{ext}:{classifier}"
                print(f"[kprod_broker] fetching {coordinate} from Maven Central into {target} (once)",
                      file=sys.stderr, flush=True)
                shutil.rmtree(target, ignore_errors=True)  # what an interrupted run left
                target.mkdir(parents=True)
                archive = _fetch_file(target, artifact, classifier, ext)
                try:
                    shutil.unpack_archive(archive, target / "unpacked", filter="data")
                finally:
                    archive.unlink(missing_ok=True)  # Ivy's copy: fetched again only if unpacking failed
                done.write_text(coordinate + "\n")
    return target / "unpacked"


def _fetch(target: Path, artifacts: Sequence[str], excludes: Sequence[str]) -> None:
    exclusions = "".join(f"<exclude org={quoteattr(g)} module={quoteattr(a)}/>"
                         for g, a in (e.split(":") for e in excludes))
    # default->default: each module's jar and its runtime dependencies (Maven's runtime scope).
    dependencies = "".join(
        f"<dependency org={quoteattr(g)} name={quoteattr(a)} rev={quoteattr(v)} conf=\"default->default\">"
        f"{exclusions}</dependency>"
        for g, a, v in (artifact.split(":") for artifact in artifacts))
    (target / "ivy.xml").write_text(
        f'<ivy-module version="2.0"><info organisation="kprod.cache" module={quoteattr(target.name)}/>'
        f"<dependencies>{dependencies}</dependencies></ivy-module>\n")
    shutil.rmtree(target / "libs", ignore_errors=True)
    # Named artifact-version.jar, as in PySpark's own jars/ (spark_kafka_jars compares them).
    _run_ivy(target, ", ".join(artifacts),
             "-retrieve", str(target / "libs" / "[artifact]-[revision](-[classifier]).[ext]"))
    if not any((target / "libs").glob("*.jar")):
        raise KafkaUnavailableError(f"Ivy fetched no jar of {', '.join(artifacts)} from {_MAVEN_CENTRAL}")


def _fetch_file(target: Path, artifact: str, classifier: str, ext: str) -> Path:
    """One file of Maven Central (no dependencies) into Ivy's cache: its path there."""
    group, module, version = artifact.split(":")
    # A Maven classifier is Ivy's extra attribute m:classifier.
    (target / "ivy.xml").write_text(
        f'<ivy-module version="2.0" xmlns:m="http://ant.apache.org/ivy/maven">'
        f'<info organisation="kprod.cache" module={quoteattr(target.name)}/><dependencies>'
        f'<dependency org={quoteattr(group)} name={quoteattr(module)} rev={quoteattr(version)} '
        f'transitive="false" conf="default->master"><artifact name={quoteattr(module)} type={quoteattr(ext)} '
        f'ext={quoteattr(ext)} m:classifier={quoteattr(classifier)}/></dependency></dependencies></ivy-module>\n')
    listing = target / "cachepath.txt"
    _run_ivy(target, f"{artifact}:{ext}:{classifier}", "-cachepath", str(listing))
    found = [Path(p) for p in listing.read_text().strip().split(os.pathsep) if p] if listing.exists() else []
    if len(found) != 1 or not found[0].is_file():
        raise KafkaUnavailableError(f"Ivy fetched no {artifact}:{ext}:{classifier} from {_MAVEN_CENTRAL}")
    return found[0]


def _run_ivy(target: Path, what: str, *args: str) -> None:
    """Ivy on ``target``'s ivy.xml, from Maven Central, into the cache's shared Ivy downloads."""
    # Maven Central only: Ivy's default chain first looks in two local repositories for
    # each of ~60 modules, which doubles a first fetch.
    (target / "ivysettings.xml").write_text(
        '<ivysettings><settings defaultResolver="central"/><resolvers>'
        f'<ibiblio name="central" m2compatible="true" root="{_MAVEN_CENTRAL}"/></resolvers></ivysettings>\n')
    result = subprocess.run(
        [java(), "-jar", str(ivy_jar()), "-settings", str(target / "ivysettings.xml"),
         "-cache", str(cache_dir() / "ivy"), "-ivy", str(target / "ivy.xml"), "-confs", "default", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True)
    output = result.stdout + result.stderr
    if result.returncode != 0 or "UNRESOLVED DEPENDENCIES" in output:
        raise KafkaUnavailableError(f"Ivy could not fetch {what} from {_MAVEN_CENTRAL}:\n{output[-3000:]}")


def kafka_artifacts(version: str = KAFKA_VERSION) -> tuple[str, ...]:
    """Apache Kafka ``version``'s server and tools, and a logging binding for its line."""
    logging = (f"org.apache.logging.log4j:log4j-slf4j-impl:{_LOG4J_VERSION}" if int(version.split(".")[0]) >= 4
               else _SLF4J_RELOAD4J)
    return (f"org.apache.kafka:kafka_2.13:{version}", f"org.apache.kafka:kafka-tools:{version}", logging)


def kafka_classpath(version: str = KAFKA_VERSION) -> str:
    """Apache Kafka's server and tools jars, fetched on first use."""
    jars = maven_jars(f"kafka-{version}", kafka_artifacts(version), _KAFKA_EXCLUDES)
    return os.pathsep.join(str(p) for p in jars)


def kafka_clients_jar(version: str = KAFKA_VERSION) -> Path:
    """The kafka-clients jar of ``version``: Kafka's message definitions
    (``common/message/*.json``), from which ``spark_sink/protocol/kmsg.py`` is generated."""
    name = f"kafka-clients-{version}.jar"
    for jar in map(Path, kafka_classpath(version).split(os.pathsep)):
        if jar.name == name:
            return jar
    raise KafkaUnavailableError(f"no {name} among the jars fetched into {cache_dir() / f'kafka-{version}'}")


def spark_kafka_jars(spark_version: str | None = None) -> list[Path]:
    """Spark's own Kafka sink (``spark-sql-kafka-0-10_2.13`` of the running Spark) and what
    it needs at run time that Spark does not already ship, for ``spark.jars``."""
    return _spark_package_jars("spark-sql-kafka", "spark-sql-kafka-0-10_2.13", spark_version,
                               ", or leave Spark's own Kafka sink out (the benchmarks' --skip-spark-kafka)")


def spark_avro_jars(spark_version: str | None = None) -> list[Path]:
    """Spark's Avro functions (``spark-avro_2.13`` of the running Spark: ``to_avro`` and
    ``from_avro``, against which the tests check kprod's Avro bodies), for ``spark.jars``."""
    return _spark_package_jars("spark-avro", "spark-avro_2.13", spark_version)


def _spark_package_jars(name: str, artifact_id: str, spark_version: str | None, without: str = "") -> list[Path]:
    import pyspark

    version = spark_version or pyspark.__version__
    try:
        jars = maven_jars(f"{name}-{version}", [f"org.apache.spark:{artifact_id}:{version}"])
    except KafkaUnavailableError as exc:
        # Apache publishes some PySpark releases to PyPI without every module on Maven
        # Central (spark-sql-kafka 4.2.1 and 4.3.0 are missing there).
        raise KafkaUnavailableError(
            f"{artifact_id} {version} (the package of the PySpark installed here) cannot be fetched from "
            f"{_MAVEN_CENTRAL}: use a PySpark whose {artifact_id} is there, as make venv's is "
            f"(pip install 'pyspark=={SPARK_PACKAGES_VERSION}'){without}. Ivy said:\n{exc}") from None

    def artifact(jar: Path) -> str:
        return re.sub(r"-\d[\w.]*\.jar$", "", jar.name)

    shipped = {artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [j for j in jars if artifact(j) not in shipped]
