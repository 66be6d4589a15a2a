"""Many hosts: JAX's own multi-controller runtime (`initialize` before anything touches a device)."""

from jaxtrain._src.distributed import PEER_LOST_EXIT_CODE, detected_cluster, initialize

__all__ = ["PEER_LOST_EXIT_CODE", "detected_cluster", "initialize"]
