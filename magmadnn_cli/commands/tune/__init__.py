"""`magmadnn tune`: the search (`search`: trials run in turn or dealt to the ranks, the best kept), its
trials (`search_space`), each trial's config (`trial_config`), its journal (`trial_log`) and how
trials rank (`objective`)."""

from .search import tune

__all__ = ["tune"]
