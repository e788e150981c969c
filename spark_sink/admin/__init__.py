"""The admin client: coordinator requests from the calling thread, on the client layer
(ending, fencing and describing transactions, committing and reading offsets, a broker's
settings). Public API."""

from spark_sink.admin.admin_client import AdminClient
from spark_sink.protocol.txn_coordinator import PreparedTransaction, TransactionState

__all__ = ["AdminClient", "PreparedTransaction", "TransactionState"]
