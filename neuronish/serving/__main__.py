"""`python -m neuronish.serving`: the same as `neuronish-model-server`."""

import sys

from .server import main

sys.exit(main())
