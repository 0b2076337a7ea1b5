"""The statistics snapshot of a singleton."""

from __future__ import annotations

from dataclasses import dataclass
from typing import final


@final
@dataclass(frozen=True, slots=True)
class Statistics:
    """An immutable snapshot of one singleton in one process.

    Counters start at zero in every process: a forked child does not
    inherit its parent's.

    Attributes:
        builds: Successful factory calls.
        build_failures: Factory calls that raised (any exception,
            ``KeyboardInterrupt`` included; not a cancelled async build).
        closes: Retired clients whose close hook returned normally.
        close_failures: Retired clients whose close hook raised.
        generation: The build number of the live client, 0 when none is
            live.
        key_fingerprint: :func:`~poolkeeper.fingerprint` of the live
            client's key; ``None`` without a key or a live client.
        pid: The process these numbers describe.
        leases: Leases held right now, on live and retired clients.
        pending_close: Retired clients whose close waits for their leases.
        resets_refused: ``reset()`` calls refused by
            *min_rebuild_interval*.
        is_overridden: Whether an ``override()`` block is active.

    .. versionadded:: 0.1
    """

    builds: int
    build_failures: int
    closes: int
    close_failures: int
    generation: int
    key_fingerprint: str | None
    pid: int
    leases: int
    pending_close: int
    resets_refused: int
    is_overridden: bool
