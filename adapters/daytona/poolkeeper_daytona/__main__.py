"""``python -m poolkeeper_daytona demo``: the adapter's command line."""

from __future__ import annotations

import sys

from poolkeeper_daytona._cli import main

if __name__ == "__main__":
    sys.exit(main())
