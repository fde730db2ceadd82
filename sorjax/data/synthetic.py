"""Synthetic languages with exact oracles, in NumPy, seeded and reproducible.

One module per language; this one gathers their public names:

- `dyck`: Dyck-(k, m), Hewitt et al.'s bounded Dyck automaton (Lin et al.
  4.1, Renganathan & Singh 4.2): `DyckKM` with sample / oracle /
  closing_distances / oracle_score, Lin et al.'s presets.
- `pcfg`: the Dyck-2 PCFG of Suzgun et al. (Mahto et al. A.10): `DyckPCFG`
  with sample / targets / timescales, Mahto's and Suzgun's presets.
- `keyword_trees`: Le & Zuidema's keyword task on uniform random binary
  trees, Experiments 1 (by length) and 2 (by keyword depth).
- `markov`: Mahto et al.'s bigram-resampled control corpus.
"""

from sorjax.data import keyword_trees
from sorjax.data.dyck import DyckKM, OracleScore, SplitSpec, bracket_pairs
from sorjax.data.dyck import PRESETS as DYCK_PRESETS
from sorjax.data.dyck import make_splits as make_dyck_splits
from sorjax.data.keyword_trees import (KeywordExample, depth_experiment,
                                       length_experiment)
from sorjax.data.markov import bigram_successors, markov_corpus
from sorjax.data.pcfg import DyckPCFG
from sorjax.data.pcfg import PRESETS as PCFG_PRESETS
from sorjax.data.pcfg import make_splits as make_pcfg_splits

__all__ = [
    "DYCK_PRESETS", "DyckKM", "DyckPCFG", "KeywordExample", "OracleScore",
    "PCFG_PRESETS", "SplitSpec", "bigram_successors", "bracket_pairs",
    "depth_experiment", "keyword_trees", "length_experiment",
    "make_dyck_splits", "make_pcfg_splits", "markov_corpus",
]
