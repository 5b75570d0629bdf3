"""Model-based search: a Gaussian-process surrogate over the encoded space, expected improvement over every
unseen valid point, plus a little local search around the incumbent.

- It starts with `init` uniformly drawn points.
- The model is fitted to log(score) (scores are times: multiplicative effects become additive, and the few
  very slow points stop dominating). Failed points are results too: they enter the model at the worst
  log-time seen so far, so the model learns to stay away from the regions where points fail.
- Kernel: Matern 5/2 with one lengthscale per encoded column (ARD), fitted by maximum marginal likelihood
  (L-BFGS-B over log lengthscales and log noise) every `refit` results (every 1/32nd of the results once
  there are more than 32 x refit), warm-started from the last fit.
- The GP is fitted to at most `max_fit` results (the best half and a spread of the rest), so an ask costs
  the planner about the same at 2000 results as at 400. Hyperparameters are fitted to at most `max_hyper`
  of those (again the best half and a spread), with the exact gradient of the marginal likelihood.
- Each step scores every unseen valid point (the spaces are small enough) by expected improvement over the
  best seen log-time; with probability `local` it restricts the choice to the unseen one-parameter
  neighbours of the incumbent (local search where the model is least sure of the fine structure).
- Batch mode, for a planner that keeps many points in flight: the model is blind to the pending points anyway,
  so it is refitted only once more than pending/8 new results have come in since the last fit; in between,
  asks take the next unseen point of the last fit's expected-improvement ranking, and hyperparameters are
  refitted at most once per `pending` results. With one point in flight (ask, tell, ask, ...) every ask
  refits, exactly as without batch mode.
It never proposes a seen point; when every point is seen it returns None.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.optimize import minimize
from scipy.special import erfc

from kfactory.strategies.base import Point, Space, Strategy
from kfactory.strategies.agreement import SourceTrust, Trust, finite_log_times
from kfactory.strategies.encoding import SeenMask, fit_subset, index_of
from kfactory.strategies.options import Option
from kfactory.strategies.transfer import PriorMean

OPTIONS: dict[str, Option] = {
    "init": Option("uniformly drawn points before the model is fitted (a warm start skips them)", 10, int, low=1),
    "refit": Option("results between two fits of the kernel's hyperparameters", 8, int, low=1),
    "local": Option("chance that an ask picks among the incumbent's unseen neighbours only", 0.2, float, low=0,
                    high=1),
    "xi": Option("expected improvement's margin, in log-time", 0.0, float, low=0),
    "max_candidates": Option("unseen points scored per ask (a random subset of larger spaces)", 4000, int, low=1),
    "max_fit": Option("results the GP is fitted to (the best half and a spread of the rest)", 400, int, low=2),
    "max_hyper": Option("results the hyperparameters are fitted to", 256, int, low=2),
    "queue": Option("batch mode: points kept from one fit's ranking for the asks until the next", 256, int, low=1),
}

_SQ5 = math.sqrt(5.0)


def _matern(D2: np.ndarray) -> np.ndarray:
    r = np.sqrt(np.maximum(D2, 0.0))
    return (1.0 + _SQ5 * r + (5.0 / 3.0) * D2) * np.exp(-_SQ5 * r)


def _sqdist(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    return np.maximum((A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * A @ B.T, 0.0)


class GP:
    """A small exact GP with ARD Matern 5/2 and unit signal variance on standardised targets."""

    def __init__(self, d: int):
        self.log_ls = np.full(d, math.log(0.5))
        self.log_noise = math.log(1e-2)

    def _nll(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Negative log marginal likelihood (plus a weak prior on the log lengthscales) and its exact gradient
        in theta = (log lengthscales, log noise): one Cholesky factorisation per evaluation, where a
        finite-difference gradient would take one per dimension."""
        ls, noise = np.exp(theta[:-1]), math.exp(theta[-1])
        Z = X / ls
        D2 = _sqdist(Z, Z)
        r = np.sqrt(D2)
        e = np.exp(-_SQ5 * r)
        K = (1.0 + _SQ5 * r + (5.0 / 3.0) * D2) * e + (noise + 1e-8) * np.eye(len(X))
        try:
            c, low = cho_factor(K, lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            return 1e10, np.zeros_like(theta)
        alpha = cho_solve((c, low), y, check_finite=False)
        # weak prior keeps lengthscales in a sane range on tiny data
        dev = theta[:-1] - math.log(0.5)
        nll = float(0.5 * y @ alpha + np.log(np.diag(c)).sum() + 0.5 * np.sum(dev ** 2) / 4.0)
        # d nll = 1/2 tr((K^-1 - alpha alpha^T) dK); for log lengthscale j, dK = F * (z_j - z_j')^2 with
        # F = 5/3 (1 + sqrt5 r) exp(-sqrt5 r); for log noise, dK = noise * I
        W = cho_solve((c, low), np.eye(len(X)), check_finite=False) - np.outer(alpha, alpha)
        M = W * ((5.0 / 3.0) * (1.0 + _SQ5 * r) * e)
        g_ls = (Z * Z * M.sum(1)[:, None]).sum(0) - (Z * (M @ Z)).sum(0) + dev / 4.0
        g_noise = 0.5 * noise * np.trace(W)
        return nll, np.append(g_ls, g_noise)

    def fit_hyper(self, X: np.ndarray, y: np.ndarray, maxiter: int = 25) -> None:
        theta0 = np.append(self.log_ls, self.log_noise)
        bounds = [(math.log(0.05), math.log(20.0))] * len(self.log_ls) + [(math.log(1e-4), math.log(0.5))]
        res = minimize(self._nll, theta0, args=(X, y), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": maxiter})
        theta = res.x if np.all(np.isfinite(res.x)) else theta0
        self.log_ls, self.log_noise = theta[:-1], float(theta[-1])

    def fit(self, X: np.ndarray, y: np.ndarray) -> None:
        self.ls = np.exp(self.log_ls)
        self.Xs = X / self.ls
        K = _matern(_sqdist(self.Xs, self.Xs)) + (math.exp(self.log_noise) + 1e-8) * np.eye(len(X))
        self.L = np.linalg.cholesky(K)
        self.alpha = cho_solve((self.L, True), y, check_finite=False)

    def predict(self, Xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        Ks = _matern(_sqdist(Xq / self.ls, self.Xs))
        mu = Ks @ self.alpha
        v = solve_triangular(self.L, Ks.T, lower=True, check_finite=False)
        var = np.maximum(1.0 - (v * v).sum(0), 1e-12)
        return mu, np.sqrt(var)


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float, xi: float = 0.0) -> np.ndarray:
    imp = best - mu - xi
    z = imp / sd
    cdf = 0.5 * erfc(-z / math.sqrt(2.0))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return imp * cdf + sd * pdf


class Surrogate(Strategy):
    def __init__(self, space: Space, seed: int, init: int = 10, refit: int = 8, local: float = 0.2,
                 xi: float = 0.0, max_candidates: int = 4000, max_fit: int = 400, max_hyper: int = 256,
                 queue: int = 256):
        super().__init__(space, seed)
        self.idx = index_of(space)
        self.init, self.refit, self.local, self.xi = init, refit, local, xi
        self.max_candidates, self.max_fit, self.max_hyper, self.queue_len = max_candidates, max_fit, max_hyper, queue
        self.gp = GP(self.idx.X.shape[1])
        self._seen_mask = SeenMask(self.idx, self.seen)
        self._last_hyper = -10**9
        self._np = np.random.default_rng(seed)
        self._seed = seed
        self.prior: PriorMean | None = None
        self.source_trust: SourceTrust | None = None
        self._trust: tuple[int, Trust] | None = None
        #: batch mode: the last fit's unseen points, best expected improvement first, and how many results it saw
        self._queue: list[int] = []
        self._fit_results = -1

    def warm(self, evidence: list) -> None:
        """Model this campaign's log-times as a fitted prior mean from the other campaigns plus a GP residual,
        and skip the random initial design (see transfer.py)."""
        prior = PriorMean(self.idx, evidence, GP)
        self.prior = prior if prior else None
        if self.prior is not None:
            self.source_trust = SourceTrust(prior.M, prior.sources, self.idx.X, GP, seed=self._seed)

    def trust(self) -> Trust | None:
        """Each source's agreement with this campaign's results so far and its weight (agreement.py); None
        without evidence to trust."""
        if self.source_trust is None:
            return None
        if self._trust is None or self._trust[0] != len(self.results):  # asked several times per result
            self._trust = (len(self.results), self.source_trust(*finite_log_times(self.results, self.idx.pos)))
        return self._trust[1]

    def _prior_mean(self, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The warm start's prior mean over the space, fitted to these results; zero on a cold start (warm sets
        the prior and the trust in its sources together, so a prior always has a trust)."""
        trust = self.trust()
        if self.prior is None or trust is None:
            return np.zeros(len(self.idx))
        return self.prior.fit(rows, y, trust)

    def _unseen(self) -> np.ndarray:
        return np.flatnonzero(~self._seen_mask())

    def _data(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows of the index, log-times) of every result, failures at the worst log-time seen."""
        rows, ys, failed = [], [], []
        for p, s in self.results.items():
            i = self.idx.pos.get(p)
            if i is None:
                continue
            if s is None or not (s > 0 and math.isfinite(s)):
                failed.append(i)
            else:
                rows.append(i)
                ys.append(math.log(s))
        if len(rows) < 2:
            return None
        y = np.array(ys)
        worst = y.max()
        rows += failed
        y = np.concatenate([y, np.full(len(failed), worst)])
        return np.array(rows), y

    def _from_queue(self) -> Point | None:
        """Batch mode: the next unseen point of the last fit's ranking while that fit is fresh enough."""
        if len(self.results) - self._fit_results > self.pending() // 8:
            return None
        while self._queue:
            p = self.idx.points[self._queue.pop(0)]
            if p not in self.seen:
                return p
        return None

    def _next(self) -> Point | None:
        if (p := self._from_queue()) is not None:
            return p
        unseen = self._unseen()
        if len(unseen) == 0:
            return None
        data = self._data() if len(self.results) >= (0 if self.prior else self.init) else None
        if data is None and self.prior and len(self.results) < self.init:
            # no two results to fit yet: the point the other campaigns predict best; only for as many asks as a
            # cold start draws at random, since where the sources' best region fails on this device every result
            # is a failure and the fit would never come (then uniform draws, as cold)
            return self.idx.points[int(unseen[int(np.argmin(self.prior.M.mean(0)[unseen]))])]
        if data is None:
            return self.idx.points[int(self._np.choice(unseen))]
        rows, y = data
        base = self._prior_mean(rows, y)
        r = y - base[rows]
        m, s = r.mean(), r.std() or 1.0
        fit = fit_subset(y, self.max_fit)  # the best results and a spread of the rest
        X, ys = self.idx.X[rows[fit]], (r[fit] - m) / s
        # hyperparameters settle as results accumulate: refit every `refit` results up to 32 x refit results
        # (every campaign of a few hundred points), then every 1/32nd of them
        if len(y) - self._last_hyper >= max(self.refit, len(y) // 32, self.pending()):
            if len(ys) > self.max_hyper:  # the best and a spread again: hyperparameters need fewer rows
                hyper = fit_subset(ys, self.max_hyper)
                self.gp.fit_hyper(X[hyper], ys[hyper])
            else:
                self.gp.fit_hyper(X, ys)
            self._last_hyper = len(y)
        self.gp.fit(X, ys)
        cand = unseen
        if self.rng.random() < self.local:
            best_p = min((sc, p.params_json, p) for p, sc in self.results.items() if sc is not None)[2]
            near = self.idx.neighbours(self.idx.pos[best_p])
            near = np.intersect1d(near, unseen, assume_unique=False)
            if len(near):
                cand = near
        if len(cand) > self.max_candidates:
            # a random share of the unseen points plus every unseen neighbour of the best few
            good = sorted((sc, p.params_json, p) for p, sc in self.results.items() if sc is not None)[:5]
            near = np.concatenate([self.idx.neighbours(self.idx.pos[p]) for _, _, p in good] or [cand[:0]])
            cand = np.union1d(self._np.choice(cand, self.max_candidates, replace=False),
                              np.intersect1d(near, cand))
        mu, sd = self.gp.predict(self.idx.X[cand])
        # expected improvement on the scale of log-time: the prior mean plus the residual model
        ei = expected_improvement(base[cand] + m + s * mu, s * sd, y.min(), self.xi * s)
        best = int(np.argmax(ei))
        self._fit_results = len(self.results)
        self._queue = []
        if self.pending() >= 8:
            order = np.argsort(-ei, kind="stable")[:self.queue_len]
            self._queue = [int(cand[j]) for j in order if j != best]
        return self.idx.points[int(cand[best])]


def make(space: Space, seed: int, **options) -> Strategy:
    """A Gaussian-process surrogate with expected improvement; options as in OPTIONS."""
    return Surrogate(space, seed, **options)
