"""kfactory's default search strategy: the one that measured best on the recorded spaces
(bench/search_quality.py): the portfolio of the GP surrogate, Optuna's TPE and the island evolutionary search,
with budget moved to whichever member is improving (see portfolio.py)."""
from kfactory.strategies.base import Space, Strategy
from kfactory.strategies.portfolio import OPTIONS as PORTFOLIO_OPTIONS
from kfactory.strategies.portfolio import Portfolio

#: the portfolio's: the default strategy is a portfolio with its default members
OPTIONS = PORTFOLIO_OPTIONS


def make(space: Space, seed: int, **options) -> Strategy:
    """The default portfolio; options as portfolio's."""
    return Portfolio(space, seed, **options)
