"""Metrics and analyses of trained models (restored with `sorjax.restore`).

    run = sorjax.restore("/tmp/run")
    from sorjax.analysis import dyck
    dyck.plot_ldpa(dyck.ldpa(run), "ldpa.png")

Modules: perplexity, dyck (LDPA/WCPA, PCFG accuracy by timescale),
timescales (Mahto et al.), attention (principal angles, heatmaps),
tree_gradients (Le & Zuidema), minimal_pairs (BLiMP), characters
(per-position loss), traces (per-layer states and gates), runner (the
named analyses of `experiments.analyze`). Imported on first use.
"""

import importlib

_MODULES = ("attention", "characters", "common", "dyck", "dyck_metrics",
            "figures", "minimal_pairs", "perplexity", "runner", "timescales",
            "traces", "tree_gradients")


def __getattr__(name):
  if name in _MODULES:
    return importlib.import_module(f"sorjax.analysis.{name}")
  if name == "AnalysisError":
    from sorjax.analysis.common import AnalysisError
    return AnalysisError
  raise AttributeError(f"module 'sorjax.analysis' has no attribute {name!r}")
