"""Optuna's samplers through its ask-and-tell API (optuna is a project dependency): TPE here, CMA-ES in cma.py.

Every parameter is a categorical distribution (the values of a family's parameter); with several families the
family is one more categorical and the other families' parameters are sampled but ignored. With `ordinal`, a
parameter whose values are all numbers is instead an integer distribution over the positions of its sorted
values (block sizes, tile sizes, flags): the form CMA-ES can model, where it would sample a categorical one
independently at random.
- The objective is log(score), so TPE's split into good and bad points is scale-free.
- A sampled point that breaks a constraint, or one already seen, is told to the study as failed
  (TrialState.FAIL) and the sampler asks again; it costs no evaluation. After `tries` such draws it falls back
  to a uniformly drawn unseen valid point (told to the study as a fixed trial when its result comes).
- A point whose run failed is told with a penalty: the worst log-score seen plus `penalty` (TPE then counts it
  among the bad points and learns to avoid its region), not as FAIL (which TPE would ignore).
- Results for points it did not ask (a portfolio tells every member everything) enter as fixed trials.
- Batch mode, for a planner that keeps many points in flight (8 or more pending): each failed draw
  is one more trial that every later ask of Optuna walks through, so instead of drawing again it takes the
  unseen valid point nearest the first draw (fewest parameters changed). With fewer pending it draws as above.
  And since each ask of TPE costs in proportion to the trials of its study, a batch-mode study that reaches
  3 x `keep` results is rebuilt from `keep` of them (the best half and an even spread of the rest).
"""
from __future__ import annotations

import math

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from kfactory.strategies.base import Point, Space, Strategy
from kfactory.strategies.encoding import SeenMask, fit_subset, index_of
from kfactory.strategies.options import Option

OPTIONS: dict[str, Option] = {
    "sampler": Option("Optuna's sampler: multivariate TPE, or uniform random draws", "tpe", str,
                      choices=("tpe", "random")),
    "startup": Option("random trials before TPE models the results", 10, int, low=0),
    "tries": Option("draws that break a constraint or repeat a point before an unseen valid point is taken", 40, int,
                    low=1),
    "penalty": Option("a failed point's value: the worst log-time seen plus this", 0.5, float, low=0),
    "keep": Option("results a batch-mode study is rebuilt from once it holds 3 x keep", 500, int, low=1),
    "ordinal": Option("search ordered numeric parameters as positions in their sorted values", False, bool),
}

optuna.logging.set_verbosity(optuna.logging.WARNING)


class _FixedSpaceTPE(optuna.samplers.TPESampler):
    """TPE over a search space known in advance. Every trial of the study carries the same distributions, so
    the joint search space is all of them (less the single-valued ones) once a trial has completed, as Optuna
    would infer it; inferring it walks back through every trial since the oldest running one on each ask,
    which with a thousand points in flight cost the planner more than the sampling itself."""

    def __init__(self, dists: dict, **options):
        super().__init__(**options)
        self.fixed = {n: d for n, d in sorted(dists.items()) if not d.single()}
        self.completed = False  # set by the strategy when it tells the study a value

    def infer_relative_search_space(self, study, trial) -> dict:
        return dict(self.fixed) if self.completed else {}


def _sampler(kind: str, seed: int, startup: int, dists: dict):
    seed %= 2 ** 32  # campaign seeds are 64-bit; numpy's legacy seeding that Optuna uses takes 32 bits
    if kind == "tpe":
        return _FixedSpaceTPE(dists, seed=seed, n_startup_trials=startup, multivariate=True, constant_liar=True)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown optuna sampler {kind!r}")


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


class OptunaSearch(Strategy):
    def __init__(self, space: Space, seed: int, sampler: str = "tpe", startup: int = 10, tries: int = 40,
                 penalty: float = 0.5, keep: int = 500, ordinal: bool = False):
        super().__init__(space, seed)
        self.tries, self.penalty, self.keep = tries, penalty, keep
        self.fams = list(space.families.values())
        self.dists: dict[str, BaseDistribution] = {}
        #: study key -> the sorted values an integer distribution indexes (ordinal parameters only)
        self.ordinal: dict[str, list] = {}
        if len(self.fams) > 1:
            self.dists["__family__"] = CategoricalDistribution([f.name for f in self.fams])
        for f in self.fams:
            for name, values in f.spec.params.items():
                key = self._key(f.name, name)
                if ordinal and len(values) > 1 and _numeric(values):
                    self.ordinal[key] = sorted(values)
                    self.dists[key] = IntDistribution(0, len(values) - 1)
                else:
                    self.dists[key] = CategoricalDistribution(list(values))
        self.sampler = _sampler(sampler, seed, startup, self.dists)
        self.study = optuna.create_study(direction="minimize", sampler=self.sampler)
        self.trials: dict[Point, optuna.trial.Trial] = {}  # asked, awaiting results
        self.worst: float | None = None
        #: every value told, and how many results the current study holds
        self.values: dict[Point, float] = {}
        self.in_study = 0
        self._seen_mask: SeenMask | None = None  # built with the space's index, on the first batch-mode snap

    def _key(self, fam: str, name: str) -> str:
        return name if len(self.fams) == 1 else f"{fam}.{name}"

    def _values(self, trial_params: dict) -> dict:
        """Study parameters with each ordinal position replaced by its value."""
        return {k: self.ordinal[k][v] if k in self.ordinal else v for k, v in trial_params.items()}

    def _point(self, trial_params: dict) -> Point:
        fam = self.fams[0].name if len(self.fams) == 1 else trial_params["__family__"]
        spec = self.space.families[fam].spec
        values = self._values(trial_params)
        return Point.of(fam, {n: values[self._key(fam, n)] for n in spec.params})

    def _dist_params(self, point: Point) -> dict:
        """Study parameters of a point (other families' parameters take their first value)."""
        out: dict[str, object] = {}
        if len(self.fams) > 1:
            out["__family__"] = point.family
        params = point.params
        for f in self.fams:
            for n, values in f.spec.params.items():
                key, v = self._key(f.name, n), params[n] if f.name == point.family else values[0]
                out[key] = self.ordinal[key].index(v) if key in self.ordinal else v
        return out

    def _next(self) -> Point | None:
        batch = self.pending() >= 8
        for _ in range(1 if batch else self.tries):
            trial = self.study.ask(self.dists)
            p = self._point(trial.params)
            if p in self.seen or p in self.trials or not self.space.valid(p):
                self.study.tell(trial, state=TrialState.FAIL)
                continue
            self.trials[p] = trial
            return p
        return self._nearest_unseen(trial.params) if batch else self._fresh_random()

    def _nearest_unseen(self, trial_params: dict) -> Point | None:
        """The unseen valid point that differs from a drawn one in the fewest parameters (ties at random)."""
        idx = index_of(self.space)
        trial_params = self._values(trial_params)
        fam = self.fams[0].name if len(self.fams) == 1 else trial_params["__family__"]
        f = list(self.space.families).index(fam)
        # the drawn point as a row of the index's codes (one column per family and parameter, -1 elsewhere)
        drawn = np.array([vals.index(trial_params[self._key(g.name, n)]) if g.name == fam else -1
                          for g in self.fams for n, vals in g.spec.params.items()], dtype=np.int32)
        dist = idx.hamming_to(drawn, f).astype(float)
        if self._seen_mask is None:
            self._seen_mask = SeenMask(idx, self.seen)
        dist[self._seen_mask()] = np.inf
        if not np.isfinite(dist.min()):
            return self._fresh_random()
        ties = np.flatnonzero(dist == dist.min())
        return idx.points[int(ties[self.rng.randrange(len(ties))])]

    def _value(self, score: float | None) -> float:
        if score is not None and score > 0 and math.isfinite(score):
            v = math.log(score)
            self.worst = v if self.worst is None else max(self.worst, v)
            return v
        return (self.worst if self.worst is not None else 0.0) + self.penalty

    def tell(self, point: Point, score: float | None) -> None:
        super().tell(point, score)
        value = self._value(score)
        if isinstance(self.sampler, _FixedSpaceTPE):
            self.sampler.completed = True
        self.values[point] = value
        trial = self.trials.pop(point, None)
        if trial is not None:
            self.study.tell(trial, value)
        else:
            self.study.add_trial(self._fixed(point, value))
        self.in_study += 1
        if self.in_study >= 3 * self.keep and self.pending() >= 8:
            self._rebuild()

    def _fixed(self, point: Point, value: float) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(params=self._dist_params(point), distributions=self.dists, value=value)

    def _rebuild(self) -> None:
        """A new study of `keep` results; the asked points still in flight come back as fixed trials."""
        points = list(self.values)
        kept = fit_subset(np.array([self.values[p] for p in points]), self.keep)
        self.study = optuna.create_study(direction="minimize", sampler=self.sampler)
        self.study.add_trials([self._fixed(points[i], self.values[points[i]]) for i in kept])
        self.trials.clear()
        self.in_study = len(kept)


def make(space: Space, seed: int, **options) -> Strategy:
    """Optuna's TPE (or random) sampler through ask-and-tell; options as in OPTIONS."""
    return OptunaSearch(space, seed, **options)
