"""Imports the built-in methods, each of which registers itself (config, presets) on import."""

