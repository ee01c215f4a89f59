"""Imports the built-in methods, each of which registers itself (config, presets) on import."""

import eatta.methods.baseline
import eatta.methods.cema
import eatta.methods.cotta
import eatta.methods.eatta
import eatta.methods.eatta_variants
import eatta.methods.eta
import eatta.methods.hiltta
import eatta.methods.rdumb
import eatta.methods.sar
import eatta.methods.simatta
import eatta.methods.source
import eatta.methods.tent  # noqa: F401
