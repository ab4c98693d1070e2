"""``python -m storebench``: the same command line as ``storebench``."""

import sys

from .cli import main

# Guarded: a process spawned from ``python -m storebench`` (a generator worker, verify's
# child) imports this module as ``__mp_main__`` and must not run the command again.
if __name__ == "__main__":
    sys.exit(main())
