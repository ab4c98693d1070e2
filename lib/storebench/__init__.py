"""storebench: how to store an image training set, and how to feed it to the accelerator."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("storebench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
