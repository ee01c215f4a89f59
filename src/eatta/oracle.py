"""Former home of the synchronous oracles, now :mod:`eatta.annotate.oracle` (kept as an alias)."""

from eatta.annotate.oracle import *  # noqa: F403  (the alias re-exports that module's names)
from eatta.annotate.oracle import __all__ as __all__
