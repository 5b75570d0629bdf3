"""The planner's fold over the events stream, and resuming campaigns after a restart.

Campaign state is a fold over the events stream: at start-up the planner replays the stream from its
beginning, so a restarted planner resumes unfinished campaigns where they were. Until it has caught up with the
stream's end it only folds; then it answers pending requests, fails campaigns that cannot run, and resumes
the rest.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

from kfactory.agents import persona_stage
from kfactory.bus import deadletters
from kfactory.bus.origins import Origin, parse
from kfactory.bus.outcomes import ack_quietly
from kfactory.bus.topology import EVENTS_STREAM, Stage
from kfactory.claims.base import ClaimsError
from kfactory.evidence import trust
from kfactory.evidence.verdicts import found_wrong
from kfactory.observability import tracing as telemetry
from kfactory.platform.service import Service
from kfactory.services.planner.campaign import CampaignState
from kfactory.services.planner.driver import CampaignDriver
from kfactory.services.planner.resends import ResendDesk
from kfactory.v1 import events_pb2 as pb


#: the claims-store key of a refused submission's reason (StreamReplay.abandoned), so that a restarted planner
#: cancels its start too should it reach the stream: kept without expiry, as the stream keeps the start
ABANDONED_KEY = "abandoned:{}"


class StreamReplay:
    """Folds every event of the stream into the planner's campaigns, from the stream's first event on."""

    def __init__(self, svc: Service, campaigns: dict[str, CampaignState], driver: CampaignDriver,
                 resends: ResendDesk, new_state: Callable[[str, pb.CampaignSpec], CampaignState],
                 refuse: Callable[[pb.Event, str], None]):
        """`new_state` makes a started campaign's state; `refuse` records an event that cannot be believed."""
        self.svc, self.campaigns, self.driver, self.resends = svc, campaigns, driver, resends
        self.new_state, self.refuse = new_state, refuse
        #: set once the stream has been folded up to its end as it was at start-up
        self.caught_up = asyncio.Event()
        #: campaigns whose start this planner could not confirm to their client, by id: the reason they are
        #: cancelled with, never run, should their start reach the stream after all
        self.abandoned: dict[str, str] = {}
        #: campaigns whose CampaignStarted this planner has read back from the stream (a start whose publish
        #: timed out may still have landed: then the campaign runs, see PlannerService.submit)
        self.landed: set[str] = set()
        #: per problem (CampaignState.problem_key), the kernels a comparison folded so far found wrong, each with
        #: the campaign that did (evidence.verdicts.found_wrong): every other campaign of the problem learns them
        #: (CampaignState.learn_wrong), one started later too; the stream's order makes a replay learn the same
        self.wrong: dict[str, dict[str, str]] = {}

    async def follow(self, stop: asyncio.Event) -> None:
        """Fold the events stream from its beginning until `stop`."""
        svc = self.svc
        last = await svc.bus.last_seq(EVENTS_STREAM)
        if last == 0:
            self._catch_up()
        async for event, msg in svc.bus.follow(None, stop=stop):
            t0 = time.perf_counter()
            with telemetry.consumer_span(svc.name, msg.subject, msg.headers, event):
                if event.HasField("campaign_started"):
                    self.landed.add(event.campaign_id)
                    if self.caught_up.is_set():   # during the replay: asked at the catch-up, of unfinished ones only
                        await self._recall_abandoned(event.campaign_id)
                self.fold(event)
            if self.caught_up.is_set() and event.HasField("resend_requested"):
                self.resends.answer_later(event.campaign_id, event.resend_requested.dlq_seq)
            svc.handled += 1
            await ack_quietly(msg)
            svc.cost["handler"] += time.perf_counter() - t0
            if not self.caught_up.is_set() and msg.metadata.sequence.stream >= last:
                await self._recall_unfinished()
                self._catch_up()

    def fold(self, event: pb.Event) -> None:
        """Apply one event of the stream. No event may stop the fold: a restarted planner replays the stream
        and would meet the same event at every start, so the planner could never run again."""
        try:
            self.apply(event)
        except Exception as e:  # noqa: BLE001 (any bug folding one event fails its campaign, never the planner)
            self.svc.log.exception("folding an event failed", event_id=event.id[:120])
            st = self.campaigns.get(event.campaign_id)
            if st is not None and not st.broken:
                st.broken = f"planner error folding event {event.id[:120]}: {type(e).__name__}: {e}"
                self.fail_broken(st)

    def apply(self, event: pb.Event) -> None:
        """Fold one event into its campaign's state (a CampaignStarted makes the state); an event of a campaign
        this planner does not know only matters when it asks for, or answers, a dead letter's resend."""
        cid = event.campaign_id
        if event.HasField("campaign_started") and cid not in self.campaigns:
            if why := trust.body_flaw(event):
                self.refuse(event, why)
                return
            self.campaigns[cid] = self.new_state(cid, event.campaign_started.spec)
            if cid in self.abandoned:
                self.cancel_abandoned(self.campaigns[cid], self.abandoned.pop(cid))
            elif self.campaigns[cid].broken:
                self.fail_broken(self.campaigns[cid])
        st = self.campaigns.get(cid)
        if st is not None:
            if why := st.apply(event):
                self.refuse(event, why)
            elif event.HasField("campaign_started"):
                for candidate, by in self.wrong.get(st.problem_key, {}).items():
                    st.learn_wrong(candidate, by)
            elif event.HasField("comparison") and (candidate := found_wrong(event.comparison)):
                self._share_wrong(st, candidate)
        elif event.HasField("resend_requested"):
            self.resends.strays.add((cid, event.resend_requested.dlq_seq))
        elif event.HasField("resend_answered"):
            self.resends.strays.discard((cid, event.resend_answered.dlq_seq))

    def _share_wrong(self, st: CampaignState, candidate: str) -> None:
        """Campaign `st`'s comparison found `candidate` wrong: no other campaign of its problem, running or started
        later, finishes with it (memory's KnownWrong at a start tells only what memory had archived by then). A
        finished one learns it too (its result and summary are fixed already), so that a restarted planner, which
        folds a finish where the stream holds it, reaches the same state as the live one, which folds its own
        finish before publishing it."""
        self.wrong.setdefault(st.problem_key, {}).setdefault(candidate, st.id)
        for other in self.campaigns.values():
            if other is not st and other.problem_key == st.problem_key:
                other.learn_wrong(candidate, st.id)

    def abandon(self, cid: str, reason: str) -> None:
        """Forget a campaign this planner submitted but could not publish the start of; should the start reach
        the stream after all, its campaign is cancelled with `reason`, never run, instead of left unfinished and
        undriven."""
        self.campaigns.pop(cid, None)
        self.abandoned[cid] = reason

    async def remember_abandoned(self, cid: str, reason: str) -> None:
        """Keep an abandoned campaign's reason in the claims store too: this planner's memory of it ends with
        its process, and a start already on the stream (an acknowledgement lost with the rest) would run under
        a restarted planner. Without the store, only this planner remembers (logged)."""
        try:
            await self.svc.claims.cache_put(ABANDONED_KEY.format(cid), reason.encode())
        except ClaimsError as e:   # unreachable, or refused (READONLY, NOPERM, OOM): the client still hears why
            self.svc.log.warning("the refused submission is remembered by this planner only: a restarted planner "
                                 "would run its start should it reach the stream", campaign=cid, error=str(e))

    async def _recall_abandoned(self, cid: str) -> None:
        """Before a start of a campaign this planner does not know is folded (once caught up): whether a planner
        refused its submission (remember_abandoned), so that the fold cancels it, never runs it."""
        if cid in self.campaigns or cid in self.abandoned:
            return
        if (reason := await self._abandoned_reason(cid, "it runs")) is not None:
            self.abandoned[cid] = reason

    async def _recall_unfinished(self) -> None:
        """At the catch-up: which of the campaigns the stream left unfinished and nobody drives a planner refused
        (remember_abandoned), so that they are cancelled, never run, not resumed. Asked here, not at each replayed
        start: a finished campaign needs no answer (nor one the replay would cancel again, publishing another
        finish), and a replay costs no store round trip per campaign the stream ever held."""
        for cid, st in list(self.campaigns.items()):
            if st.finished is None and not st.driven and cid not in self.driver.loops:
                if (reason := await self._abandoned_reason(cid, "it resumes")) is not None:
                    self.cancel_abandoned(st, reason)

    async def _abandoned_reason(self, cid: str, otherwise: str) -> str | None:
        """The reason a planner refused campaign `cid`'s submission with, or None: none was refused, or the claims
        store cannot say (logged, with what the campaign does `otherwise`: no store may stop the fold)."""
        try:
            reason = await self.svc.claims.cache_get(ABANDONED_KEY.format(cid))
        except ClaimsError as e:   # unreachable, or refusing (READONLY, NOPERM)
            self.svc.log.warning(f"cannot ask the claims store whether this campaign's submission was refused; "
                                 f"{otherwise}", campaign=cid, error=str(e))
            return None
        return None if reason is None else reason.decode(errors="replace")

    def cancel_abandoned(self, st: CampaignState, reason: str) -> None:
        """Finish as cancelled, never run, a campaign whose start reached the stream after its client was told
        that nothing started (it may have submitted it again): what it ran would be work nobody asked for, and
        a failure would be one nobody was told of; `kfactory status` shows the reason."""
        st.cancelled, st.driven = reason, True
        self.svc.log.warning("a refused submission's start reached the stream: cancelled, not run", campaign=st.id)
        self.driver.launch(st, self.driver.finish(st, state="cancelled", reason=reason))

    def fail_broken(self, st: CampaignState) -> None:
        """Fail an unfinished campaign that cannot run (st.broken), once this planner has caught up: during
        the replay a later event of the stream may still show it finished."""
        if not self.caught_up.is_set() or st.finished is not None or st.driven:
            if st.driven:  # its driving task fails it at its next step
                st.changed.set()
            return
        st.driven = True
        self.svc.log.error("campaign failed", campaign=st.id, reason=st.broken)
        self.driver.launch(st, self.driver.finish(st, state="failed", reason=st.broken))

    def _catch_up(self) -> None:
        self.caught_up.set()
        # requests made while this planner was down (or before this life replayed their answers)
        for cid, seq in sorted(self.resends.strays):
            self.resends.answer_later(cid, seq)
        for cid, st in self.campaigns.items():
            for seq in sorted(st.resend_requests):
                self.resends.answer_later(cid, seq)
            if st.finished is None and st.broken:
                self.fail_broken(st)
            elif st.finished is None and cid not in self.driver.loops:
                self.svc.log.info("resuming campaign", campaign=cid)
                st.driven = True
                self.driver.launch(st, self._resume(st))

    async def _resume(self, st: CampaignState) -> None:
        """Queue again the proposals without a candidate and the dead letters' work it accepted to send back (a
        resend is deduplicated), then drive the campaign."""
        bus = self.svc.bus
        for seq in list(st.resent.values()):
            if (record := await deadletters.fetch(bus, seq)) is not None:
                await deadletters.send_back(bus, record)
        for event in list(st.proposals.values()):
            kind, persona = parse(event.point_proposed.origin)
            stage = persona_stage(persona) if kind is Origin.AGENT else Stage.CODER
            with telemetry.root_span(f"{self.svc.name} propose", **{"kf.campaign": st.id, "kf.resumed": True}):
                await bus.send_work(stage, event)
        await self.driver.drive(st)
