"""``python -m storebench``: the same command line as ``storebench``."""

import sys

from .cli import main

sys.exit(main())
