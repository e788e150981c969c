"""Kafka error codes as exceptions, one class per code, exported by name.

Every exception kprod raises derives from :class:`KProdError`. Broker errors derive from
:class:`KafkaError` and carry the code, the protocol name and whether a client may retry
(``retriable``) or must refresh metadata first (``invalid_metadata``). Code refers to an
error by its class (``isinstance(error, NotLeaderOrFollowerError)``) or the class's
``code`` (``code == DuplicateSequenceNumberError.code``), never by its number.

The table ``errors.tsv`` beside this module is the one place each error is defined: every
code of the Kafka protocol up to Kafka 4.3, with the retry and metadata flags of the Java
client's exception for it. Each class is named after its protocol name
(``NOT_LEADER_OR_FOLLOWER`` is ``NotLeaderOrFollowerError``). ``tests/protocol/test_errors.py``
checks the table against the kafka-clients jar the test broker runs.
"""

from __future__ import annotations

from importlib import resources
from typing import ClassVar


class KProdError(Exception):
    """Root of every error kprod raises.

    ``retriable``: trying the same operation again may succeed. ``invalid_metadata``: the
    client's view of the cluster is out of date, so it refreshes metadata before retrying.
    """

    retriable: ClassVar[bool] = False
    invalid_metadata: ClassVar[bool] = False


class CorruptRecordError(KProdError):
    """Bytes that do not decode: a bad CRC, a truncated frame, an unexpected correlation id."""


class KafkaConnectionError(KProdError):
    """A broker connection failed or was closed before a response arrived."""

    retriable = True
    invalid_metadata = True


class KafkaError(KProdError):
    """An error code returned by a broker: the base of the classes of ``errors.tsv``."""

    code: ClassVar[int] = -1
    name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"

    def __init__(self, message: str | None = None) -> None:
        self.message = message
        super().__init__(message)  # args stay (message,): a pickled copy is made the same way

    def __str__(self) -> str:
        label = f"[{self.name} ({self.code})]"
        return f"{label} {self.message}" if self.message else label


class UnknownErrorCode(KafkaError):
    """A code the table does not know (from a newer broker): not retriable. Each such code
    gets its own subclass, made on first sight, so that ``code`` is a class attribute as
    for every other error."""

    def __reduce__(self) -> tuple:
        return error_for_code, (self.code, self.message)


NO_ERROR = 0  # the code of a response, or a part of one, that succeeded

ERRORS_BY_CODE: dict[int, type[KafkaError]] = {}


def _error(code: int, name: str, retriable: bool, invalid_metadata: bool) -> type[KafkaError]:
    """One row of the table: the exception class for ``code``, registered by code."""
    camel = "".join(part.capitalize() for part in name.split("_"))
    class_name = camel if camel.endswith(("Error", "Exception")) else camel + "Error"
    cls = type(class_name, (KafkaError,), {
        "code": code, "name": name, "retriable": retriable, "invalid_metadata": invalid_metadata,
        "__doc__": f"Kafka error {code}: {name}.", "__module__": __name__, "__qualname__": class_name,
    })
    if code in ERRORS_BY_CODE:
        raise ValueError(f"error code {code} defined twice")  # a slip in errors.tsv
    ERRORS_BY_CODE[code] = cls
    return cls


def _load_table() -> None:
    """Define the class of every row of ``errors.tsv`` and bind it in this module by name.

    The table is data, one row per code as in Kafka's own ``Errors`` enum; code imports the
    classes by name like any other.
    """
    text = resources.files(__package__).joinpath("errors.tsv").read_text()  # also from a --py-files zip
    rows = (line.split("\t") for line in text.splitlines() if line and not line.startswith(("#", "code\t")))
    for code, name, retriable, invalid_metadata in rows:
        cls = _error(int(code), name, retriable == "yes", invalid_metadata == "yes")
        globals()[cls.__name__] = cls


_load_table()

__all__ = [
    "ERRORS_BY_CODE", "NO_ERROR", "CorruptRecordError", "KProdError", "KafkaConnectionError", "KafkaError",
    "UnknownErrorCode", "error_for_code", *(cls.__name__ for cls in ERRORS_BY_CODE.values()),
]


def error_for_code(code: int, message: str | None = None) -> KafkaError | None:
    """The exception for a broker error code, or None for NO_ERROR.

    A code the table does not know gives an :class:`UnknownErrorCode` carrying it.
    """
    if code == NO_ERROR:
        return None
    cls = ERRORS_BY_CODE.get(code) or _UNKNOWN_CODES.get(code)
    if cls is None:
        cls = _UNKNOWN_CODES[code] = type(f"UnknownErrorCode{code}", (UnknownErrorCode,), {
            "code": code, "name": f"UNKNOWN_CODE_{code}", "__module__": __name__})
    return cls(message)


_UNKNOWN_CODES: dict[int, type[KafkaError]] = {}
