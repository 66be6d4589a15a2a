"""Reference models."""

from jaxtrain._src.models import *  # noqa: F401,F403
from jaxtrain._src.models import __all__  # noqa: F401
