"""``python -m poolkeeper_daytona_demo demo``: the demo's command line."""

from __future__ import annotations

import sys

from poolkeeper_daytona_demo._cli import main

if __name__ == "__main__":
    sys.exit(main())
