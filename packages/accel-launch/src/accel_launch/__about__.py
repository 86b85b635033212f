"""The package version, read by hatch and at run time."""

__version__ = "0.1.0"
