"""Every tuner by name: the one list the cfg, the command line and `make_tuner` read.

A module of its own, with no imports, so that `config` can read the names without loading
numpy or xgboost.
"""

TUNERS = {
    "grid": ("autosched.search.tuners.grid", "GridTuner"),
    "random": ("autosched.search.tuners.random_search", "RandomTuner"),
    "xgboost": ("autosched.search.tuners.xgb", "XGBoostTuner"),
}
TUNER_NAMES = tuple(TUNERS)
