"""Claims: deduplication, fenced locks, device leases and a result cache.

``open_claims(url)`` returns the store for a URL:

* ``None``, ``""`` or ``"memory://"``: ``MemoryClaims``, in this process only (the default
  for single-process runs);
* ``"redis://..."`` or ``"rediss://..."``: ``RedisClaims``, shared by every process that
  opens the same server.

Typical use::

    claims = open_claims(settings.redis_url)
    if await claims.claim_once(f"{campaign}:{point_id}"):
        schedule(point_id)
    async with claims.hold(f"point:{point_id}", ttl_s=30) as lock:
        result = await run(point_id)
        write(result, fence=lock.fence)   # readers drop results with a stale fence
"""

from __future__ import annotations

from kfactory.claims.base import (
    KEY_PREFIX,
    Claims,
    ClaimsError,
    ClaimsUnavailable,
    HeldLock,
    Lock,
    LockTimeout,
    device_key,
    redact_url,
)
from kfactory.claims.memory import MemoryClaims
from kfactory.claims.redis import RedisClaims

__all__ = [
    "KEY_PREFIX",
    "Claims",
    "ClaimsError",
    "ClaimsUnavailable",
    "HeldLock",
    "Lock",
    "LockTimeout",
    "MemoryClaims",
    "RedisClaims",
    "device_key",
    "open_claims",
]

_MEMORY_URLS = ("", "memory://")
_REDIS_SCHEMES = ("redis://", "rediss://")


def open_claims(url: str | None = None, *, prefix: str = KEY_PREFIX) -> Claims:
    """Return the claims store for ``url`` (see the module docstring); connects lazily.

    ``prefix`` namespaces every key the store writes. Raises ValueError for an
    unsupported URL; call ``await claims.ping()`` to check a Redis server is reachable.
    """
    if url is None or url in _MEMORY_URLS:
        return MemoryClaims(prefix=prefix)
    if url.startswith(_REDIS_SCHEMES):
        return RedisClaims(url, prefix=prefix)
    raise ValueError(
        f"unsupported claims URL {redact_url(url)!r}: use memory:// or redis://host:port/db"
    )
