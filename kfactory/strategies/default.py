"""kfactory's default search strategy: the one that measured best on the recorded spaces
(bench/search_quality.py): the portfolio of the GP surrogate, Optuna's TPE and the island evolutionary search,
with budget moved to whichever member is improving (see portfolio.py)."""
from kfactory.strategies.base import Space, Strategy
from kfactory.strategies.portfolio import Portfolio


def make(space: Space, seed: int, **options) -> Strategy:
    return Portfolio(space, seed, **options)
