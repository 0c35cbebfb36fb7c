"""edge-speech: an offline-first speech appliance for small Linux devices."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("edge-speech")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+src"

__all__ = ["__version__"]
