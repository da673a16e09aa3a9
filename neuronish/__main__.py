"""`python -m neuronish ...` is the `neuronish` command (for environments whose
scripts directory is not on PATH)."""

import sys

from neuronish.cli import main

if __name__ == "__main__":
    sys.exit(main())
