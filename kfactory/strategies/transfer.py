"""Transfer from other campaigns: a prior mean over the whole space, built from what memory measured elsewhere.

A warm start proposes a few good points from other campaigns first. That helps only where the other devices'
best points are good here too. Often they are not (the best convolution point on an A100 ranks 372nd of 4201
on an A4000, although the two devices rank the whole space alike, Spearman 0.89). What does carry over is the
shape of the landscape. So each source (one earlier campaign) gets a small GP fitted to its measured
log(relative score), and its prediction over every point of this space is that source's prior mean m_s.

On this campaign's own results y (log seconds), the sources are weighted by how well they rank the better half
of the points measured here (Spearman, negative or unknown agreement counts as 0 once there are enough results,
equal weights before), combined into m, and the campaign's model is y ~ a + b m + residual, with (a, b) fitted by least
squares and b shrunk towards 1 while results are few. A source that disagrees with this device loses its
weight; if all disagree, b falls to 0 and the search is a cold one again.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.stats import spearmanr

from kfactory.strategies.base import Evidence, Point
from kfactory.strategies.encoding import SpaceIndex, fit_subset

#: results needed before the sources are weighted by their agreement with this device
MIN_AGREEMENT = 6
#: from this many results on, the agreement is judged on the better half of them only
TOP_HALF = 2 * MIN_AGREEMENT
#: pseudo-observations that pull b towards 1 while this campaign has few results
SHRINK = 4.0
#: above this many measurements a source's values are used directly (no GP)
DIRECT = 1500
#: the most measurements of one source a GP is fitted to
GP_ROWS = 160


class PriorMean:
    """Per-source predictions of log(relative score) over every point of a space, and their combination."""

    def __init__(self, idx: SpaceIndex, evidence: list[Evidence], gp_factory):
        self.idx = idx
        by_source: dict[str, list[tuple[int, float]]] = {}
        for e in evidence:
            i = idx.pos.get(e.point)
            if i is not None and e.relative > 0 and math.isfinite(e.relative):
                by_source.setdefault(e.source, []).append((i, math.log(e.relative)))
        self.sources: list[str] = []
        preds = []
        for source, rows in sorted(by_source.items()):
            if len(rows) < 3:
                continue
            preds.append(_fit_predict(idx, rows, gp_factory))
            self.sources.append(source)
        self.M = np.array(preds) if preds else np.zeros((0, len(idx)))

    def __bool__(self) -> bool:
        return len(self.sources) > 0

    def weights(self, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Each source's weight: its rank agreement with this campaign's results (equal while they are few), on
        the better half of them once there are TOP_HALF. Devices tend to agree about the slow points, which any
        search soon leaves, and differ about the fast ones: convolution on an A4000 ranks the whole A100 space
        at Spearman 0.89 but its best tenth at 0.24, and trusting the 0.89 kept warm starts on an A100 in the
        A4000's best region for hundreds of evaluations."""
        k = len(self.sources)
        if len(rows) < MIN_AGREEMENT:
            return np.full(k, 1.0 / k)
        if len(rows) >= TOP_HALF:
            better = np.argsort(y, kind="stable")[: len(y) // 2]
            rows, y = rows[better], y[better]
        w = np.zeros(k)
        for s in range(k):
            if np.ptp(self.M[s, rows]) == 0 or np.ptp(y) == 0:
                continue  # a constant ranks nothing: no agreement
            w[s] = max(0.0, float(spearmanr(self.M[s, rows], y)[0]))
        return w / w.sum() if w.sum() > 0 else w

    def fit(self, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The prior mean a + b m over every point of the space, fitted to this campaign's results."""
        m = self.weights(rows, y) @ self.M
        x = m[rows]
        n = len(rows)
        if n == 0:
            return m
        xc, yc = x - x.mean(), y - y.mean()
        # least squares for b with SHRINK pseudo-points at slope 1: b = (Sxy + SHRINK) / (Sxx + SHRINK)
        sxx, sxy = float(xc @ xc), float(xc @ yc)
        scale = max(sxx / n, 1e-6)
        b = max(0.0, (sxy + SHRINK * scale) / (sxx + SHRINK * scale))
        a = float(y.mean() - b * x.mean())
        return a + b * m


def rank_points(evidence: list[Evidence], k: int) -> list[Point]:
    """The k distinct points of the evidence that the sources rate best together: by the mean of log(relative
    score) over the sources that measured each (a point near the best on every device before one that is the
    best on one device and mediocre on another), ties in a fixed order. A warm start proposes these first."""
    scores: dict[Point, list[float]] = {}
    for e in evidence:
        if e.relative > 0 and math.isfinite(e.relative):
            scores.setdefault(e.point, []).append(math.log(e.relative))
    ranked = sorted(scores, key=lambda p: (float(np.mean(scores[p])), p.family, p.params_json))
    return ranked[:k]


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
