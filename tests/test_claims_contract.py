"""Contract suite for claims stores: every test runs on the in-process store and on Redis.

The Redis store runs against a real redis-server started by tests/redis_server.py; each
test gets its own key prefix so tests cannot see each other's keys.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from kfactory.claims import (
    Claims,
    ClaimsUnavailable,
    HeldLock,
    Lock,
    LockTimeout,
    MemoryClaims,
    RedisClaims,
    open_claims,
)
from ports import free_port

# tests/ is not a package, so pytest puts it on sys.path and the helper imports by its
# own name; the fallback keeps working if tests/ becomes a package later.
try:
    from redis_server import RedisServerMissing, redis_server
except ModuleNotFoundError:
    from tests.redis_server import RedisServerMissing, redis_server

# The suite runs on three workers on a busy two-core machine, where a test can be paused for 100-700 ms at any
# moment. A pause can only make a lock *more* expired, so a short TTL is safe (and fast) where a test needs a lock
# or mark to have EXPIRED; where it must STILL be held after some work, its TTL leaves room for such a pause.
TTL = 0.2  # seconds: only for what must have expired after a sleep (oversleeping is harmless)
LONG_TTL = 10.0  # seconds: for what must still be held and is never waited out (it costs no time)
HOLD_TTL = 2.0  # seconds: hold() renews every HOLD_TTL/3, so its lock survives a pause of up to 4/3 s


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """One redis-server for the whole session."""
    with redis_server() as url:
        yield url


@pytest.fixture(params=["memory", "redis"])
async def claims(request: pytest.FixtureRequest) -> AsyncIterator[Claims]:
    """The store under test, with a fresh namespace."""
    prefix = f"kf:test:{uuid.uuid4().hex}:"
    if request.param == "memory":
        store = open_claims(None, prefix=prefix)
    else:
        store = open_claims(request.getfixturevalue("redis_url"), prefix=prefix)
    await store.ping()
    yield store
    await store.close()


# --- claim_once -------------------------------------------------------------------------


async def test_claim_once_first_caller_wins(claims: Claims) -> None:
    assert await claims.claim_once("campaign-1:point-7") is True
    assert await claims.claim_once("campaign-1:point-7") is False
    assert await claims.claim_once("campaign-1:point-8") is True
    assert await claims.claim_once("campaign-2:point-7") is True


async def test_claim_once_with_ttl_is_claimable_after_expiry(claims: Claims) -> None:
    # while its TTL runs the mark blocks others; a long TTL so that a pause cannot end it early
    assert await claims.claim_once("live", ttl_s=LONG_TTL) is True
    assert await claims.claim_once("live", ttl_s=LONG_TTL) is False
    # once its TTL has run out the key can be claimed again
    assert await claims.claim_once("p", ttl_s=TTL) is True
    await asyncio.sleep(TTL + 0.1)
    assert await claims.claim_once("p", ttl_s=LONG_TTL) is True
    assert await claims.claim_once("p") is False


async def test_many_concurrent_claim_once_exactly_one_wins(claims: Claims) -> None:
    results = await asyncio.gather(*(claims.claim_once("hot") for _ in range(50)))
    assert results.count(True) == 1


# --- locks ------------------------------------------------------------------------------


async def test_acquire_held_by_other_returns_none(claims: Claims) -> None:
    lock = await claims.acquire("k", LONG_TTL)
    assert isinstance(lock, Lock) and lock.key == "k"
    assert await claims.acquire("k", LONG_TTL) is None
    assert await claims.acquire("other", LONG_TTL) is not None
    assert await claims.release(lock) is True
    assert await claims.acquire("k", LONG_TTL) is not None


async def test_many_concurrent_acquire_exactly_one_wins(claims: Claims) -> None:
    locks = await asyncio.gather(*(claims.acquire("hot", LONG_TTL) for _ in range(20)))
    assert sum(lock is not None for lock in locks) == 1


async def test_release_with_stale_token_fails_and_keeps_holder(claims: Claims) -> None:
    lock = await claims.acquire("k", LONG_TTL)
    assert lock is not None
    stale = Lock(key="k", token="not-the-token", fence=lock.fence)
    assert await claims.release(stale) is False
    assert await claims.renew(stale, LONG_TTL) is False
    assert await claims.acquire("k", LONG_TTL) is None  # the holder still has it
    assert await claims.release(lock) is True
    assert await claims.release(lock) is False  # already released


async def test_fencing_tokens_strictly_increase(claims: Claims) -> None:
    assert await claims.latest_fence("k") == 0
    fences = []
    for _ in range(5):
        lock = await claims.acquire("k", 1.0)
        assert lock is not None
        fences.append(lock.fence)
        assert await claims.latest_fence("k") == lock.fence
        assert await claims.release(lock)
    assert fences == sorted(set(fences))
    assert fences[0] >= 1
    assert await claims.latest_fence("unrelated") == 0


async def test_expired_lock_is_taken_and_old_holder_is_fenced_out(claims: Claims) -> None:
    old = await claims.acquire("k", TTL)
    assert old is not None
    await asyncio.sleep(TTL + 0.1)
    new = await claims.acquire("k", LONG_TTL)
    assert new is not None
    assert new.fence > old.fence
    assert await claims.latest_fence("k") == new.fence  # a late write under `old` is stale
    assert await claims.renew(old, LONG_TTL) is False
    assert await claims.release(old) is False
    assert await claims.acquire("k", LONG_TTL) is None  # the new holder was not disturbed
    assert await claims.release(new) is True


async def test_renew_extends_lock_past_original_ttl(claims: Claims) -> None:
    # The renewal must come before the original TTL runs out (0.95 s of room for a pause); the check after it
    # sleeps past the original TTL, where a renewal that did nothing would have let the lock go.
    original = 1.0
    lock = await claims.acquire("k", original)
    assert lock is not None
    await asyncio.sleep(0.05)
    assert await claims.renew(lock, LONG_TTL) is True
    await asyncio.sleep(original)  # past the original TTL (1.05 s after the acquisition)
    assert await claims.acquire("k", LONG_TTL) is None
    assert await claims.renew(lock, LONG_TTL) is True
    assert await claims.release(lock) is True


async def test_invalid_ttl_is_rejected(claims: Claims) -> None:
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            await claims.acquire("k", bad)
        with pytest.raises(ValueError):
            await claims.claim_once("k", ttl_s=bad)


# --- hold -------------------------------------------------------------------------------


async def test_hold_excludes_concurrent_hold_and_renews_long_work(claims: Claims) -> None:
    spans: list[tuple[float, float]] = []
    held: list[HeldLock] = []
    first_holds = asyncio.Event()

    async def worker(work_s: float) -> None:
        async with claims.hold("device:gpu0", ttl_s=HOLD_TTL, poll_s=0.02) as lock:
            first_holds.set()
            start = time.monotonic()
            await asyncio.sleep(work_s)
            spans.append((start, time.monotonic()))
            held.append(lock)

    # The first holder works longer than the TTL (only renewal keeps the lock from the second, which polls for
    # it all along); the second starts once the first holds the lock, and its own work can be short.
    first = asyncio.create_task(worker(HOLD_TTL * 1.2))
    await asyncio.wait_for(first_holds.wait(), timeout=5.0)
    await asyncio.gather(first, worker(0.0))
    (a_start, a_end), (b_start, b_end) = sorted(spans)
    assert a_end <= b_start
    assert not any(lock.lost for lock in held)
    assert held[1].fence > held[0].fence


async def test_hold_keeps_lock_past_ttl_and_releases_on_exit(claims: Claims) -> None:
    async with claims.hold("k", ttl_s=HOLD_TTL) as lock:
        await asyncio.sleep(HOLD_TTL * 1.2)  # past the TTL: only renewal keeps it
        assert await claims.acquire("k", LONG_TTL) is None
        assert not lock.lost
    assert await claims.release(lock) is False  # already released by hold()
    assert await claims.acquire("k", LONG_TTL) is not None


async def test_hold_releases_on_error(claims: Claims) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with claims.hold("k", ttl_s=1.0):
            raise RuntimeError("boom")
    assert await claims.acquire("k", 1.0) is not None


async def test_hold_with_wait_raises_lock_timeout(claims: Claims) -> None:
    blocker = await claims.acquire("k", LONG_TTL)
    assert blocker is not None
    started = time.monotonic()
    with pytest.raises(LockTimeout) as info:
        async with claims.hold("k", ttl_s=HOLD_TTL, wait_s=0.2, poll_s=0.02):
            pytest.fail("acquired a lock held by another")
    # not before wait_s; the upper bound (room for pauses) only tells giving up from waiting out the blocker
    assert 0.2 <= time.monotonic() - started < 3.0
    assert info.value.key == "k"
    assert await claims.release(blocker) is True


async def test_hold_waits_for_release(claims: Claims) -> None:
    # wait_s is shorter than the blocker's TTL, so the lock can only come from the release, not from expiry;
    # hold() returns as soon as it is released, so the long wait_s costs nothing
    blocker = await claims.acquire("k", LONG_TTL)
    assert blocker is not None

    async def release_soon() -> None:
        await asyncio.sleep(0.15)
        await claims.release(blocker)

    releaser = asyncio.create_task(release_soon())
    async with claims.hold("k", ttl_s=HOLD_TTL, wait_s=LONG_TTL / 2, poll_s=0.02) as lock:
        assert lock.fence > blocker.fence
    await releaser


async def test_hold_records_lock_lost_instead_of_raising(claims: Claims) -> None:
    async with claims.hold("k", ttl_s=HOLD_TTL) as lock:
        # Simulate the lock being lost behind the holder's back and taken by another.
        assert await claims.release(lock) is True
        thief = await claims.acquire("k", LONG_TTL)
        assert thief is not None
        # the next renewal (HOLD_TTL/3 after the acquisition) finds it lost; the timeout is room for pauses
        await asyncio.wait_for(lock.lock_lost.wait(), timeout=HOLD_TTL * 5)
        assert lock.lost
    assert await claims.acquire("k", LONG_TTL) is None  # hold()'s exit did not release the thief's lock
    assert await claims.release(thief) is True


async def test_device_lease_serialises_measurements(claims: Claims) -> None:
    async with claims.device_lease("gpu-0", ttl_s=LONG_TTL, wait_s=0.5):
        with pytest.raises(LockTimeout):
            async with claims.device_lease("gpu-0", ttl_s=LONG_TTL, wait_s=0.1):
                pytest.fail("two leases on one device")
        async with claims.device_lease("gpu-1", ttl_s=LONG_TTL, wait_s=0.1):
            pass


# --- cache ------------------------------------------------------------------------------


async def test_cache_put_get_missing_and_overwrite(claims: Claims) -> None:
    assert await claims.cache_get("missing") is None
    await claims.cache_put("r", b"\x00result")
    assert await claims.cache_get("r") == b"\x00result"
    await claims.cache_put("r", b"newer")
    assert await claims.cache_get("r") == b"newer"
    await claims.cache_put("empty", b"")
    assert await claims.cache_get("empty") == b""


async def test_cache_ttl_expires(claims: Claims) -> None:
    # readable while its TTL runs (a long one, so that a pause cannot end it early) ...
    await claims.cache_put("live", b"v", ttl_s=LONG_TTL)
    assert await claims.cache_get("live") == b"v"
    # ... and gone once it has run out
    await claims.cache_put("r", b"v", ttl_s=TTL)
    await asyncio.sleep(TTL + 0.1)
    assert await claims.cache_get("r") is None
    assert await claims.cache_get("live") == b"v"


async def test_cache_rejects_non_bytes(claims: Claims) -> None:
    with pytest.raises(TypeError):
        await claims.cache_put("r", "text")  # type: ignore[arg-type]


async def test_closed_store_is_unavailable(claims: Claims) -> None:
    await claims.close()
    with pytest.raises(ClaimsUnavailable):
        await claims.ping()
    with pytest.raises(ClaimsUnavailable):
        await claims.claim_once("k")


# --- choosing and reaching a store ------------------------------------------------------


def test_open_claims_chooses_by_url() -> None:
    assert isinstance(open_claims(None), MemoryClaims)
    assert isinstance(open_claims("memory://"), MemoryClaims)
    assert isinstance(open_claims("redis://127.0.0.1:6379/0"), RedisClaims)
    with pytest.raises(ValueError, match="unsupported claims URL"):
        open_claims("postgres://db")


async def test_redis_unreachable_raises_claims_unavailable_quickly() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    claims = open_claims(url)
    started = time.monotonic()
    with pytest.raises(ClaimsUnavailable) as info:
        await claims.ping()
    assert time.monotonic() - started < 3.0
    assert url in str(info.value)
    assert info.value.url == url
    assert info.value.__cause__ is not None  # the redis error is chained
    with pytest.raises(ClaimsUnavailable):
        await claims.acquire("k", 1.0)
    await claims.close()


async def test_redis_with_password() -> None:
    with redis_server(password="s3cret") as url:
        assert ":s3cret@" in url
        async with open_claims(url) as claims:
            await claims.ping()
            assert await claims.claim_once("k") is True
            lock = await claims.acquire("k", 1.0)
            assert lock is not None and await claims.release(lock)
        no_password = url.replace(":s3cret@", "")
        async with open_claims(no_password) as anonymous:
            with pytest.raises(ClaimsUnavailable):
                await anonymous.ping()
        wrong = url.replace("s3cret", "wrong")
        async with open_claims(wrong) as intruder:
            with pytest.raises(ClaimsUnavailable) as info:
                await intruder.ping()
            assert "wrong" not in str(info.value)  # passwords are redacted from messages


def test_redis_server_helper_reports_missing_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_REDIS_SERVER", "/nonexistent/redis-server")
    with pytest.raises(RedisServerMissing, match="redis-server not found"):
        with redis_server():
            pytest.fail("started a server without a binary")
