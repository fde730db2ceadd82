"""`sorjax.data.synthetic` gathers the four languages' public names."""

import numpy as np

from sorjax.data import dyck, keyword_trees, markov, pcfg, synthetic


def test_reexports_are_the_module_objects():
  assert synthetic.DyckKM is dyck.DyckKM
  assert synthetic.DYCK_PRESETS is dyck.PRESETS
  assert synthetic.make_dyck_splits is dyck.make_splits
  assert synthetic.DyckPCFG is pcfg.DyckPCFG
  assert synthetic.PCFG_PRESETS is pcfg.PRESETS
  assert synthetic.make_pcfg_splits is pcfg.make_splits
  assert synthetic.keyword_trees is keyword_trees
  assert synthetic.length_experiment is keyword_trees.length_experiment
  assert synthetic.markov_corpus is markov.markov_corpus
  assert all(hasattr(synthetic, name) for name in synthetic.__all__)


def test_one_sample_of_each_language():
  lang = synthetic.DyckKM(2, 3)
  (s,) = lang.sample(1, 2, 20, seed=0)
  assert s[0] == lang.start and s[-1] == lang.end
  (w,) = synthetic.DyckPCFG().sample(1, 2, 20, seed=0)
  assert synthetic.DyckPCFG().targets(w)[-1, -1]     # END after a full word
  (e,) = keyword_trees.sample(1, 3, 3, seed=0)
  assert e.label == e.keyword // 100
  src = np.array([0, 1, 2, 0, 2, 1, 0])
  assert synthetic.markov_corpus(src, seed=0).size == src.size
