"""dflash-console: the operator side (headless core, Textual screen, CLI, demo) of DFlash training."""

import warnings
from importlib.metadata import PackageNotFoundError, version

# cryptography deprecates DSA (51 here), and asyncssh names its DSA types at import: ten lines of warnings on every
# command's stderr, before any output of ours (scripts read stderr's first line). We never offer DSA keys.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\..*)?$")

try:
    __version__ = version("dflash-console")
except PackageNotFoundError:  # a source tree used without installing it
    __version__ = "0+unknown"
