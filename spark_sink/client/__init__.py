"""The client layer every kprod client stands on: the clock, the client configuration,
kprod's own errors, connections (TLS, SASL, OAUTHBEARER, Kerberos), the NetworkClient,
cluster metadata, coordinator lookup and the cluster check. Its public API is what the
adapters above the producer and the admin client need."""

from spark_sink.client.cluster_check import check_cluster
from spark_sink.client.config import ClientConfig

__all__ = ["ClientConfig", "check_cluster"]
