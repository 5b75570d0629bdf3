"""Transfer from other campaigns: a prior mean over the whole space, built from what memory measured elsewhere.

A warm start proposes a few good points from other campaigns first. That helps only where the other devices'
best points are good here too. Often they are not (the best convolution point on an A100 ranks 372nd of 4201
on an A4000, although the two devices rank the whole space alike, Spearman 0.89). What does carry over is the
shape of the landscape. So each source (one earlier campaign) gets a small GP fitted to its measured
log(relative score), and its prediction over every point of this space is that source's prior mean m_s.

How far each source is trusted is measured on this campaign's own results as they arrive (agreement.py: each
source's rank agreement with the measurements, and a weight won against this device's own model). The sources
are combined by those weights into m, the campaign's model is y ~ a + b m + residual, with (a, b) fitted by
least squares and b shrunk towards 1 while results are few, and the prior mean's departure from the results'
mean is scaled by the sources' total weight: a source that disagrees with this device loses its weight, and
when all do, the prior mean is flat and the search is a cold one again.
"""
from __future__ import annotations

import math

import numpy as np

from kfactory.strategies.agreement import PRIORS_JUDGED, Trust
from kfactory.strategies.base import Evidence, Point
from kfactory.strategies.encoding import SpaceIndex, fit_subset

#: pseudo-observations that pull b towards 1 while this campaign has few results
SHRINK = 4.0
#: above this many measurements a source's values are used directly (no GP)
DIRECT = 1500
#: the most measurements of one source a GP is fitted to
GP_ROWS = 160
#: distinct points of this space a source must have measured to be learned from (fewer fit no landscape)
MIN_POINTS = 3


class PriorMean:
    """Per-source predictions of log(relative score) over every point of a space, and their combination."""

    def __init__(self, idx: SpaceIndex, evidence: list[Evidence], gp_factory):
        self.idx = idx
        by_source: dict[str, dict[int, list[float]]] = {}
        for e in evidence:
            i = idx.pos.get(e.point)
            if i is not None and e.relative > 0 and math.isfinite(e.relative):
                by_source.setdefault(e.source, {}).setdefault(i, []).append(math.log(e.relative))
        self.sources: list[str] = []
        preds = []
        for source, at in sorted(by_source.items()):
            # one value a point (a point a source reported twice is one point: the mean of its log scores)
            rows = [(i, sum(v) / len(v)) for i, v in at.items()]
            if len(rows) < MIN_POINTS:
                continue
            preds.append(_fit_predict(idx, rows, gp_factory))
            self.sources.append(source)
        self.M = np.array(preds) if preds else np.zeros((0, len(idx)))

    def __bool__(self) -> bool:
        return len(self.sources) > 0

    def fit(self, rows: np.ndarray, y: np.ndarray, trust: Trust) -> np.ndarray:
        """The prior mean over every point of the space: the sources' predictions combined by their weights in
        `trust`, fitted as a + b m to this campaign's results, with its departure from their mean scaled by the
        sources' total weight (no say: a flat prior mean at the mean of the results)."""
        w = trust.weights()
        say = float(w.sum())
        n = len(rows)
        if n == 0 or say <= 0:
            return np.full(len(self.idx), float(y.mean()) if n else 0.0)
        m = (w / say) @ self.M
        x = m[rows]
        xc, yc = x - x.mean(), y - y.mean()
        # least squares for b with SHRINK pseudo-points at slope 1: b = (Sxy + SHRINK) / (Sxx + SHRINK)
        sxx, sxy = float(xc @ xc), float(xc @ yc)
        scale = max(sxx / n, 1e-6)
        b = max(0.0, (sxy + SHRINK * scale) / (sxx + SHRINK * scale))
        return float(y.mean()) + say * b * (m - float(x.mean()))


def _log_scores(evidence: list[Evidence]) -> dict[Point, dict[str, float]]:
    """point -> source -> log(relative score), for every finite positive score."""
    scores: dict[Point, dict[str, float]] = {}
    for e in evidence:
        if e.relative > 0 and math.isfinite(e.relative):
            scores.setdefault(e.point, {})[e.source] = math.log(e.relative)
    return scores


def _rated(scores: dict[Point, dict[str, float]], weights: dict[str, float] | None) -> list[tuple[float, Point]]:
    """(weighted mean log relative score over the sources that measured it, point) for every point some
    source with a say measured; `weights` None: every source counts the same."""
    out = []
    for p, by in scores.items():
        w = {s: (1.0 if weights is None else weights.get(s, 0.0)) for s in by}
        total = sum(w.values())
        if total > 0:
            out.append((sum(w[s] * v for s, v in by.items()) / total, p))
    return out


def rank_points(evidence: list[Evidence], k: int) -> list[Point]:
    """The k distinct points of the evidence that the sources rate best together: by the mean of log(relative
    score) over the sources that measured each (a point near the best on every device before one that is the
    best on one device and mediocre on another), ties in a fixed order. A warm start proposes these first."""
    ranked = sorted(_rated(_log_scores(evidence), None), key=lambda r: (r[0], r[1].family, r[1].params_json))
    return [p for _, p in ranked[:k]]


class WarmPriors:
    """The warm start's points, proposed before the strategy's own (the planner's `--warm N`): at most `k` of
    the evidence's points, each the one the sources rate best together at that moment, the sources weighted by
    how far this campaign trusts them now (agreement.Trust, after every result: a source with no weight has no
    say in the choice; while none has any, they count the same). They stop early once every source orders this
    campaign's results against it, confidently (the upper end of its agreement's 90% interval below 0, judged on
    at least PRIORS_JUDGED results): its best points are then this device's slow ones. Without a trust (a
    strategy that does not measure one) every source counts the same, and all k are proposed."""

    def __init__(self, evidence: list[Evidence], k: int):
        self.scores = _log_scores(evidence)
        self.left = max(0, k)
        #: how many points each source measured (of those with a finite score), by source
        self.points: dict[str, int] = {}
        for by in self.scores.values():
            for source in by:
                self.points[source] = self.points.get(source, 0) + 1
        #: how many of the evidence's points were proposed
        self.proposed = 0
        #: why the proposals ended early ("" while they go on, or when all k were proposed)
        self.stopped = ""

    def next(self, trust: Trust | None, taken) -> Point | None:
        """The next point to propose (None: no more); `taken(point)` says whether it was proposed already."""
        if self.left <= 0:
            return None
        if trust is not None and trust.results >= PRIORS_JUDGED and trust.sources and all(
                s.high is not None and s.high < 0 for s in trust.sources):
            self.left = 0
            self.stopped = (f"after {trust.results} results every source ordered them against this device "
                            f"(agreement at most {max(s.high for s in trust.sources if s.high is not None):+.2f})")
            return None
        weights = {s.source: s.weight for s in trust.sources} if trust is not None else None
        if weights is not None and sum(weights.values()) <= 0:
            weights = None
        rated = [r for r in _rated(self.scores, weights) if not taken(r[1])]
        if not rated:
            self.left = 0
            return None
        self.left -= 1
        self.proposed += 1
        return min(rated, key=lambda r: (r[0], r[1].family, r[1].params_json))[1]


def _fit_predict(idx: SpaceIndex, rows: list[tuple[int, float]], gp_factory) -> np.ndarray:
    """A GP fitted to one source's log(relative) scores, predicted over every point (centred on its mean).
    A source that measured most of the space (an exhaustive tuning run) is taken as it is, the few points it
    lacks at its mean: an exact GP on thousands of points would cost more than it could add."""
    ii = np.array([i for i, _ in rows])
    y = np.array([v for _, v in rows])
    mu, sd = y.mean(), y.std() or 1.0
    if len(rows) > DIRECT:
        out = np.full(len(idx), mu)
        out[ii] = y
        return out - mu
    gp = gp_factory(idx.X.shape[1])
    fit = fit_subset(y, GP_ROWS)  # the measured values themselves are kept below
    X = idx.X[ii[fit]]
    gp.fit_hyper(X, (y[fit] - mu) / sd, maxiter=15)
    gp.fit(X, (y[fit] - mu) / sd)
    pred, _ = gp.predict(idx.X)
    out = pred * sd + mu
    out[ii] = y  # what was measured is known
    return out - mu
