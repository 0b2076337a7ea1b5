"""Keyed fingerprints: how a key is shown without revealing it."""

from __future__ import annotations

import hashlib
import os

# A per-process random key means a fingerprint cannot be brute-forced
# offline from a log line. Set POOLKEEPER_FINGERPRINT_KEY to make
# fingerprints comparable across processes. A forked child inherits the
# key, so parent and child fingerprints always match.
_SECRET = hashlib.blake2b(
    os.environ.get("POOLKEEPER_FINGERPRINT_KEY", "").encode()
    or os.urandom(32),
    digest_size=32,
).digest()


def fingerprint(value: object) -> str:
    """Return a short keyed hash of *value*, safe to log.

    Bytes are hashed as they are; anything else is hashed through its
    ``repr()``. The hash is a BLAKE2b keyed with a per-process random secret
    (or with ``POOLKEEPER_FINGERPRINT_KEY`` when that is set), so equal
    values give equal fingerprints within a process and its forked
    children, and a fingerprint reveals nothing about the value.

    Args:
        value: The value to fingerprint, typically a configuration key.

    Returns:
        Twelve lowercase hexadecimal characters.

    .. versionadded:: 0.1
    """
    data = value if isinstance(value, bytes) else repr(value).encode()
    return hashlib.blake2b(data, key=_SECRET, digest_size=6).hexdigest()
