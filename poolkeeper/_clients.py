"""Well-known SDK clients that own a connection pool.

Shared by :func:`poolkeeper.watch` (classes whose constructors it patches)
and ``poolkeeper check`` (callables whose calls it reports). Plain data,
so importing it costs nothing and imports no SDK.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CHECKED_CALLABLES", "WATCHED_CLASSES"]

#: ``module:Class`` of each class :func:`poolkeeper.watch` patches when it
#: is given no names. Each module is patched when (and if) it is imported.
WATCHED_CLASSES: Final = (
    "anthropic:Anthropic",
    "anthropic:AsyncAnthropic",
    "botocore.client:BaseClient",
    "daytona:AsyncDaytona",
    "daytona:Daytona",
    "httpx:AsyncClient",
    "httpx:Client",
    "openai:AsyncOpenAI",
    "openai:OpenAI",
    "redis:Redis",
    "requests:Session",
    "urllib3:PoolManager",
)

#: ``module:callable`` of each call ``poolkeeper check`` reports: the
#: classes above, less botocore's base class (boto3 builds its clients
#: through functions), plus those functions.
CHECKED_CALLABLES: Final = (
    *(name for name in WATCHED_CLASSES if not name.startswith("botocore")),
    "boto3:client",
    "boto3:resource",
    "redis:StrictRedis",
    "requests:session",
)
