"""``python -m poolkeeper check [PATHS]``: the ``poolkeeper`` command."""

from poolkeeper._check import main

raise SystemExit(main())
