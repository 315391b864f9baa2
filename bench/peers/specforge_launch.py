"""Run in the SpecForge venv: ``specforge`` as its console script does, after the run-time patches a CPU run
needs (none where a GPU is there). Each patch says which CUDA-only call it replaces:

- none yet (filled in as the CPU run finds them; bench/README.md lists them)."""

import sys

from specforge.cli import main

sys.exit(main(sys.argv[1:]))
