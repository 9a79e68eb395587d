"""Every tuner by name: the one list the cfg, the command line and `make_tuner` read.

A module of its own, with no imports, so that `config` can read the names without loading
numpy or xgboost.
"""

TUNERS = {
    "grid": ("autosched.tuners.grid", "GridTuner"),
    "random": ("autosched.tuners.random_search", "RandomTuner"),
    "xgboost": ("autosched.tuners.xgb", "XGBoostTuner"),
}
TUNER_NAMES = tuple(TUNERS)
