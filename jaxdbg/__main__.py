"""``python -m jaxdbg`` behaves exactly like the ``jaxdbg`` console script."""

import os
import sys

# `python -m` puts the current folder first on sys.path, where a user's timeit.py or profile.py would shadow
# the standard library inside jaxdbg itself; the console script does not. jaxdbg is already imported here,
# and targets get their own folders on sys.path from jaxdbg.target.
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from jaxdbg.cli import main

if __name__ == "__main__":
    sys.exit(main())
