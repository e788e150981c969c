PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# 0: the demo's venv without bytecode compiled ahead (tests/test_quickstart.py: the
# suite's own venv compiled the same packages).
BYTECODE ?= 1

.PHONY: venv demo-venv bytecode system-packages kafka registry kmsg lint unit test soak versions installs demo bench clean

# The system packages the suite needs (conf/system-packages.sh: installed with apt-get as
# root on Debian, else named with the command that installs them). make demo needs none.
system-packages:
	bash conf/system-packages.sh

# The venvs are (re)built whenever pyproject.toml changes, and the editable install's
# compiled encoder (spark_sink/encoder/_kernels.*.so and _formats.*.so, built in place)
# whenever their sources do. The demo's needs only Python, Java and a C compiler; the
# suite's (dev) adds the optional extras, Kerberos's among them, and the tools.
$(VENV)/.installed-demo: pyproject.toml setup.py spark_sink/encoder/_kernels.c spark_sink/encoder/_formats.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[demo]'
	$(if $(filter 1,$(BYTECODE)),$(MAKE) bytecode)
	touch $@

demo-venv: $(VENV)/.installed-demo

$(VENV)/.installed: pyproject.toml setup.py spark_sink/encoder/_kernels.c spark_sink/encoder/_formats.c
	bash conf/system-packages.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[dev]'
	$(MAKE) bytecode
	touch $@

venv: $(VENV)/.installed

# Bytecode for every module installed in the venv, on all cores (pip compiles them one by
# one). Where PYTHONDONTWRITEBYTECODE is set, as on the CI machine, no run writes any: each
# of the suite's hundreds of Python processes would compile pyspark, pandas and pyarrow
# from source again. javaobj (pyjks's, in every venv) ships a v3 module in Python 3.12
# syntax that pyjks never imports.
bytecode:
	$(PY) -m compileall -q -j 0 -x '/javaobj/v3/' "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

# Apache Kafka's jars, fetched once into ~/.cache/kprod with the Ivy inside PySpark (Java only).
kafka: venv
	@# Without Java the tests that need Kafka skip (outside CI) or fail (in CI).
	-$(PY) -c "from kprod_broker import kafka_classpath; kafka_classpath()"

# The suite's Schema Registry (Apicurio, 142 MB from Maven Central, unpacked into
# ~/.cache/kprod once), fetched the same way, before the tests that start it.
registry: venv
	-$(PY) -c "from kprod_broker.registry import apicurio_jar; apicurio_jar()"

# spark_sink/protocol/kmsg.py regenerated from the message definitions in the kafka-clients
# jar of the Kafka the suite fetches (tests/protocol/test_kafka_json.py checks it matches).
kmsg: venv kafka
	$(PY) -m spark_sink.protocol.generate "$$($(PY) -c 'from kprod_broker import kafka_clients_jar; print(kafka_clients_jar())')"

# Style and mistakes (ruff) and types (mypy), as configured in pyproject.toml.
lint: venv
	$(VENV)/bin/ruff check spark_sink kprod_broker tests jobs bench pyspark_kprod.py setup.py
	$(VENV)/bin/mypy

# The client's own behaviour, without Java (JAVA_HOME points nowhere, so a test that would
# start Kafka or Spark fails instead of starting one): the protocol, the encoder, the
# configuration, and the producer's parts against scripted network clients.
unit: venv
	JAVA_HOME=/nonexistent $(PY) -m pytest -q -p no:cacheprovider -n 2 -m "not jvm and not bench and not versions and not installs"

# The suite on TEST_WORKERS pytest-xdist workers, which overlap one another's waits (JVM
# start-ups, the network). Each worker starts its own Kafka node and SparkSession; the tests
# sharing a heavier fixture run on one worker (tests/conftest.py).
TEST_WORKERS ?= 3
# Class-data archives for the suite's JVMs (tests/jvms.py), made once per machine and JDK
# into ~/.cache/kprod: Spark's takes about 5 s of CPU off each Spark JVM's start, which run
# Spark's jars from the machine's home there (hardlinks to the first venv's, made first:
# quick). The first run makes the archives beside the suite's first minute, not before it:
# a JVM that starts before its archive is there starts without one. Later runs, in any
# clone or venv, make nothing. The 20 slowest tests are listed at the end.
test: system-packages venv kafka registry
	$(PY) -m compileall -q -j 0 spark_sink kprod_broker tests jobs pyspark_kprod.py
	$(PY) -m tests.bytecode
	$(PY) -m tests.jvms home
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m tests.jvms & archives=$$!; \
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder \
	    --durations=20; \
	status=$$?; wait $$archives; exit $$status

# The randomized transaction and exactly-once tests with many more cases than the suite's,
# then the tests marked soak: exactly-once under random connection faults (KPROD_CHAOS
# seeds), the slow tests of known gaps (strict xfails: they fail the run once fixed), and
# the further variants of suite tests (more seeds, shapes and moments of a cut).
KPROD_SOAK ?= 100
KPROD_CHAOS ?= 5
soak: venv kafka
	KPROD_SOAK=$(KPROD_SOAK) PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -p no:cacheprovider \
		tests/producer/test_transactions_model.py tests/spark/test_exactly_once_shapes.py \
		tests/spark/test_exactly_once_retried_attempts.py tests/spark/test_exactly_once_crash_points.py \
		tests/encoder/test_formats.py tests/spark/test_formats_slices.py -k "model or random or dying or the_same_on or read_back"
	KPROD_CHAOS=$(KPROD_CHAOS) PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -p no:cacheprovider -m soak tests

# The sink on PySpark 4.1, 4.2 and 4.3 (a venv each), kprod's wheel built and used by
# Python 3.11, 3.12 and 3.13 (pyenv's; a venv each), and the producer on Kafka 3.9 and 3.6.
versions: venv kafka
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -p no:cacheprovider -m versions tests/test_versions.py

# The README's cluster installs (a virtualenv archive with --archives, a zip with
# --py-files, kprod installed in the executors' Python) on a standalone cluster, with
# spark-submit, and writes through a Spark Connect server.
installs: venv kafka
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -p no:cacheprovider -m "installs and not bench" tests

# Streams through kprod into a local Apache Kafka node it starts (jars fetched on first use).
demo: demo-venv
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) jobs/demo.py

# The README's benchmarks, each against a fresh Apache Kafka node (several minutes).
bench: venv
	$(VENV)/bin/kprod-perf --num-records 1000000 --mode arrow --compare --repeat 3 --producer-props batch.size=1000000
	$(VENV)/bin/kprod-perf --num-records 1000000 --mode arrow --compare --repeat 3
	$(VENV)/bin/kprod-perf --num-records 300000 --mode record --compare --repeat 3
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) jobs/bench_sink.py --rows 1000000
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) bench/bench_latency.py
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -s -p no:cacheprovider -m bench tests

clean:
	rm -rf $(VENV) build *.egg-info spark-warehouse
