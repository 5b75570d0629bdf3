"""Redis claims store: deduplication and fenced locks shared across processes and machines.

Layout (``kf:`` is the default prefix):

* ``kf:claim:<key>``  ``SET NX [PX]`` marker written by ``claim_once``
* ``kf:lock:<key>``   current lock token, ``SET NX PX``; renewed and released by Lua
  scripts that compare the token first, so only the holder can touch it
* ``kf:fence:<key>``  ``INCR`` counter issued at each acquisition; never expires
* ``kf:cache:<key>``  cached result bytes

``claim_once`` and ``acquire`` run as Lua scripts that also recognise their own caller's
token. That makes them safe to retry after a lost reply: the retry reports the claim or
lock the first attempt already won instead of reporting it as taken by someone else.
"""

from __future__ import annotations

import contextlib
import math
import secrets
from collections.abc import Iterator
from typing import cast

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationWrongNumberOfArgsError,
    RedisError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kfactory.claims.base import (
    KEY_PREFIX,
    Claims,
    ClaimsError,
    ClaimsUnavailable,
    KeySpace,
    Lock,
    check_ttl,
    check_value,
    redact_url,
)

# KEYS[1] claim key; ARGV[1] caller token; ARGV[2] TTL in ms, "0" for no expiry.
_CLAIM_ONCE = """
local ok
if ARGV[2] == '0' then
  ok = redis.call('SET', KEYS[1], ARGV[1], 'NX')
else
  ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
end
if ok then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0
"""

# KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] token, ARGV[2] TTL in ms.
# Returns the new fence, or nil when another token holds the lock.
_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return tonumber(redis.call('GET', KEYS[2]))
end
return false
"""

# KEYS[1] lock key; ARGV[1] token, ARGV[2] TTL in ms.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1] lock key; ARGV[1] token.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# Errors that mean "cannot talk to the store" rather than "the store refused a command".
# A password sent to a server without one is a connection misconfiguration too.
_UNAVAILABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    AuthenticationWrongNumberOfArgsError,
    OSError,
)


def _ms(ttl_s: float) -> int:
    """TTL in whole milliseconds, rounded up so a lock is never shorter than asked."""
    return max(1, math.ceil(check_ttl(ttl_s) * 1000))


class RedisClaims(Claims):
    """Claims in a Redis server, shared by every process that opens the same URL."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = KEY_PREFIX,
        connect_timeout_s: float = 2.0,
        op_timeout_s: float = 5.0,
        retries: int = 2,
    ) -> None:
        """Connect lazily to ``url`` (``redis://[:password@]host:port/db`` or ``rediss://``).

        Transient connection errors are retried ``retries`` times with a short backoff;
        after that operations raise ClaimsUnavailable.
        """
        self.url = redact_url(url)
        self._keys = KeySpace(prefix)
        self._closed = False
        self._client: Redis = Redis.from_url(
            url,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=op_timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries),
            decode_responses=False,
        )
        self._claim_once = self._client.register_script(_CLAIM_ONCE)
        self._acquire = self._client.register_script(_ACQUIRE)
        self._renew = self._client.register_script(_RENEW)
        self._release = self._client.register_script(_RELEASE)

    async def claim_once(self, key: str, ttl_s: float | None = None) -> bool:
        """``SET NX`` of the claim marker; True only for the first caller until any TTL ends."""
        ttl_ms = 0 if ttl_s is None else _ms(ttl_s)
        with self._errors("claim_once"):
            won = await self._claim_once(keys=[self._keys.claim(key)], args=[_token(), ttl_ms])
        return bool(won)

    async def acquire(self, key: str, ttl_s: float) -> Lock | None:
        """``SET NX PX`` with a fresh token plus ``INCR`` of the fence, atomically."""
        ttl_ms = _ms(ttl_s)
        token = _token()
        with self._errors("acquire"):
            fence = await self._acquire(
                keys=[self._keys.lock(key), self._keys.fence(key)], args=[token, ttl_ms]
            )
        return None if fence is None else Lock(key=key, token=token, fence=int(fence))

    async def renew(self, lock: Lock, ttl_s: float) -> bool:
        """Compare-and-``PEXPIRE``: extend ``lock`` only if it still holds our token."""
        ttl_ms = _ms(ttl_s)
        with self._errors("renew"):
            renewed = await self._renew(
                keys=[self._keys.lock(lock.key)], args=[lock.token, ttl_ms]
            )
        return bool(renewed)

    async def release(self, lock: Lock) -> bool:
        """Compare-and-delete: delete ``lock`` only if it still holds our token."""
        with self._errors("release"):
            deleted = await self._release(keys=[self._keys.lock(lock.key)], args=[lock.token])
        return bool(deleted)

    async def latest_fence(self, key: str) -> int:
        """Current value of the fence counter (0 if never acquired)."""
        with self._errors("latest_fence"):
            value = await self._client.get(self._keys.fence(key))
        return 0 if value is None else int(value)

    async def cache_get(self, key: str) -> bytes | None:
        """Cached bytes for ``key`` or None."""
        with self._errors("cache_get"):
            value = await self._client.get(self._keys.cache(key))
        # the client is made with decode_responses=False, so a value is bytes (redis-py types it bytes | str)
        return cast(bytes | None, value)

    async def cache_put(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        """``SET`` (with ``PX`` when ``ttl_s`` is given) of the cached bytes."""
        data = check_value(value)
        ttl_ms = None if ttl_s is None else _ms(ttl_s)
        with self._errors("cache_put"):
            await self._client.set(self._keys.cache(key), data, px=ttl_ms)

    async def ping(self) -> None:
        """``PING`` the server; ClaimsUnavailable naming the URL if it does not answer."""
        with self._errors("ping"):
            await self._client.ping()

    async def close(self) -> None:
        """Close the connection pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._errors("close"):
            await self._client.aclose()

    @contextlib.contextmanager
    def _errors(self, operation: str) -> Iterator[None]:
        """Translate redis-py errors into the claims error types, chaining the original."""
        if self._closed and operation != "close":
            raise ClaimsUnavailable(f"claims store {self.url} is closed", url=self.url)
        try:
            yield
        except _UNAVAILABLE as exc:
            raise ClaimsUnavailable(
                f"claims store {self.url} unavailable during {operation}: {exc}", url=self.url
            ) from exc
        except RedisError as exc:
            raise ClaimsError(f"claims store {self.url} failed {operation}: {exc}") from exc


def _token() -> str:
    """A token unique to one call, so its retries can recognise their own earlier write."""
    return secrets.token_hex(16)
