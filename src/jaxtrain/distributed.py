"""Many hosts: JAX's own multi-controller runtime."""

from jaxtrain._src.distributed import *  # noqa: F401,F403
