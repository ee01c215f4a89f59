"""Imports the built-in methods, each of which registers itself (config, presets) on import."""

import eatta.methods.baseline  # noqa: F401
import eatta.methods.cema  # noqa: F401
import eatta.methods.cotta  # noqa: F401
import eatta.methods.eatta  # noqa: F401
import eatta.methods.eatta_variants  # noqa: F401
import eatta.methods.eta  # noqa: F401
import eatta.methods.rdumb  # noqa: F401
import eatta.methods.sar  # noqa: F401
import eatta.methods.simatta  # noqa: F401
import eatta.methods.source  # noqa: F401
import eatta.methods.tent  # noqa: F401
