"""``python -m jaxdbg`` behaves exactly like the ``jaxdbg`` console script."""

import sys

from jaxdbg.cli import main

if __name__ == "__main__":
    sys.exit(main())
