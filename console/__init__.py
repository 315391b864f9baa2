"""dflash-console: the operator side (headless core, Textual screen, CLI, demo) of DFlash training."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dflash-console")
except PackageNotFoundError:  # a source tree used without installing it
    __version__ = "0+unknown"
