"""The package version (one place; the package root and the golden files read it)."""
__version__ = "0.1.0"
