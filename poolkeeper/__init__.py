"""poolkeeper: one SDK client per process, built once, rebuilt safely."""

from poolkeeper import keys
from poolkeeper._async import AsyncProcessSingleton
from poolkeeper._decorator import process_singleton
from poolkeeper._fingerprint import fingerprint
from poolkeeper._records import Statistics
from poolkeeper._registry import aclose_all, close_all, made_from
from poolkeeper._sockets import release_sockets
from poolkeeper._sync import ProcessSingleton
from poolkeeper._watch import unwatch, watch
from poolkeeper.exceptions import (
    PoolkeeperError,
    PoolkeeperWarning,
    PoolLeakWarning,
    ReentrantBuildError,
    UnclosedClientWarning,
)

__all__ = [
    "AsyncProcessSingleton",
    "PoolLeakWarning",
    "PoolkeeperError",
    "PoolkeeperWarning",
    "ProcessSingleton",
    "ReentrantBuildError",
    "Statistics",
    "UnclosedClientWarning",
    "aclose_all",
    "close_all",
    "fingerprint",
    "keys",
    "made_from",
    "process_singleton",
    "release_sockets",
    "unwatch",
    "watch",
]

__version__: str = "0.1.0"


# Public objects live in private modules; name them by where users find
# them, in reprs, docs and pickles alike.
def _fix_module_names() -> None:
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("poolkeeper."):
            obj.__module__ = __name__


_fix_module_names()
