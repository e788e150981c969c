"""``format("kprod")`` from threads other than the one that created the SparkSession.

Why it fails there (PySpark 4.1-4.2, classic, pinned thread mode, PySpark's default):
Spark's ``DataSource.lookupDataSource`` resolves a name it finds no JVM class for as a
Python data source only if ``SparkSession.getActiveSession`` knows that name, and the
active session is a JVM thread-local. PySpark runs each Python thread on a JVM thread of
its own that py4j created, which has no active session: the lookup then fails with
DATA_SOURCE_NOT_FOUND for every Python data source, registered or discovered alike,
before kprod is called. Spark's Kafka sink is a JVM class, found without a session.

``use_session_in_this_thread`` sets the calling thread's JVM active session, as
PySpark's own ``createDataFrame`` does; it changes nothing for any other thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def use_session_in_this_thread(spark: SparkSession | None = None) -> None:
    """Let ``format("kprod")`` be found in the calling thread: make ``spark`` (default: the
    active or default session) its JVM thread's active session. Call it first in each
    thread that writes, e.g. ``ThreadPoolExecutor(4, initializer=use_session_in_this_thread,
    initargs=(spark,))``. Over Spark Connect the server looks the source up: nothing to do."""
    from pyspark.sql import SparkSession

    session = spark or SparkSession.getActiveSession() or SparkSession.active()
    jvm_session = getattr(session, "_jsparkSession", None)
    jvm = getattr(session, "_jvm", None)
    if jvm_session is None or jvm is None:  # Spark Connect: no JVM in this process
        return
    # The JVM thread-local that Spark's lookup of Python data sources reads.
    jvm.SparkSession.setActiveSession(jvm_session)
