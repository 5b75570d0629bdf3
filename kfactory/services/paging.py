"""Pages of a campaign list (Campaigns.List and Memory.Campaigns: ListCampaignsRequest's page_size and
page_token).

Campaigns come in the order they started (their start time in ns, then their id), `page_size` of them a page
(0: PAGE_SIZE; at most MAX_PAGE_SIZE), and a response's next_page_token names the last campaign of its page
(opaque to the client; empty on the last page). A token holds a position, not an offset: a campaign that starts
between two pages comes on a later page, and none is listed twice. (One archived between two pages with an
earlier start, an imported campaign, lies before the position already passed: the next listing shows it.) A
client reads the whole list with `every_page`. A client older than paging asks for one page, the oldest 100:
upgrade the CLI with the services.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from kfactory.v1 import services_pb2 as spb

PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
#: the page a client reading the whole list asks for (every_page): the largest, the fewest round trips
CLIENT_PAGE_SIZE = MAX_PAGE_SIZE
#: the longest campaign id a token may name (events.CAMPAIGN_ID allows 64 characters: anything far longer was
#: never given)
MAX_ID = 256

T = TypeVar("T")


class PageRequest(Protocol):
    page_size: int
    page_token: str


class PageTokenError(ValueError):
    """A page_size or page_token the list cannot take; the message says what to send instead."""


def page_size(requested: int) -> int:
    """The campaigns a page holds for a requested page_size."""
    if requested < 0:
        raise PageTokenError(f"page_size must be 0 (the default, {PAGE_SIZE}) or more, not {requested}")
    return min(requested or PAGE_SIZE, MAX_PAGE_SIZE)


def encode(started_ns: int, campaign_id: str) -> str:
    """The token of the page after the one that ends with this campaign."""
    return base64.urlsafe_b64encode(json.dumps([int(started_ns), campaign_id]).encode()).decode()


def decode(token: str) -> tuple[int, str] | None:
    """(start ns, id) of the campaign a page token follows; None for the first page (no token)."""
    if not token:
        return None
    try:
        started_ns, campaign_id = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError):   # not base64, not JSON, not a pair (binascii.Error is a ValueError)
        started_ns = campaign_id = None
    if type(started_ns) is int and -2**63 <= started_ns < 2**63 and isinstance(campaign_id, str) \
            and len(campaign_id) <= MAX_ID and _utf8(campaign_id):   # what an archive's query can hold
        return started_ns, campaign_id
    raise PageTokenError(f"page_token {token[:40]!r} is not one this list gave: ask for the first page (no token) "
                         "and follow each response's next_page_token")


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:   # a lone surrogate
        return False
    return True


def page_of(keyed: list[tuple[int, str, T]], request: PageRequest) -> tuple[list[T], str]:
    """The request's page of `keyed` ((start ns, id, item) triples, in any order) and the next page's token."""
    after, n = decode(request.page_token), page_size(request.page_size)
    rest = sorted((k for k in keyed if after is None or (k[0], k[1]) > after), key=lambda k: (k[0], k[1]))
    page = rest[:n]
    return [k[2] for k in page], encode(page[-1][0], page[-1][1]) if len(rest) > n else ""


async def every_page(fetch: Callable[[spb.ListCampaignsRequest], Awaitable[spb.ListCampaignsResponse]]
                     ) -> spb.ListCampaignsResponse:
    """Every campaign of a paged list, fetched a page at a time by `fetch` (a service's answer), in one
    response."""
    pages = _Pages()
    while (req := pages.next_request()) is not None:
        pages.add(await fetch(req))
    return pages.out


def every_page_now(fetch: Callable[[spb.ListCampaignsRequest], spb.ListCampaignsResponse]) -> spb.ListCampaignsResponse:
    """every_page with a `fetch` that answers at once (a local archive's queries)."""
    pages = _Pages()
    while (req := pages.next_request()) is not None:
        pages.add(fetch(req))
    return pages.out


class _Pages:
    """A paged list being read: the campaigns so far and the next request. A token given twice (a list that does
    not move on) is an error, not a loop."""

    def __init__(self) -> None:
        self.out = spb.ListCampaignsResponse()
        self.token: str | None = ""
        self.seen: set[str] = set()

    def next_request(self) -> spb.ListCampaignsRequest | None:
        return None if self.token is None else spb.ListCampaignsRequest(page_size=CLIENT_PAGE_SIZE,
                                                                         page_token=self.token)

    def add(self, page: spb.ListCampaignsResponse) -> None:
        self.out.campaigns.extend(page.campaigns)
        token = page.next_page_token
        if token in self.seen:
            raise PageTokenError(f"the list gave page token {token[:40]!r} twice: it does not move on")
        self.seen.add(token)
        self.token = token or None
