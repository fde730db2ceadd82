"""Tree classification: Le & Zuidema's keyword task (3) and SST.

data.dataset = "keyword": data.experiment "length" (dataset i: 10i-9..10i
leaves) or "depth" (keyword at depth i or i+1, 21..30 leaves); the label is
the keyword // 100 (10 classes) and only the root is labelled.
data.dataset = "sst": the Stanford Sentiment Treebank's binary parse trees,
5 classes (or data.binary: negative 0-1 vs positive 3-4, neutral dropped
and counted); the root label is the target, or every node's with
data.per_node.

Batches are level schedules (`sorjax.trees.encode`) padded to the split's
largest tree, so the step compiles once.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np

from sorjax import cells as cells_lib
from sorjax import trees
from sorjax.data import keyword_trees
from sorjax.data.vocab import Vocab
from sorjax.models.tree_classifier import TreeClassifier, loss_and_accuracy
from sorjax.training.tasks.common import ConfigError

log = logging.getLogger(__name__)
_LEVEL_KEYS = ("node", "left", "right", "level_mask")


def _keyword_tree(ex) -> trees.Tree:
  t = trees.Tree.from_nested(ex.tree)
  return trees.Tree(label=str(ex.label), children=t.children, word=t.word)


class TreeTask:
  name = "trees"
  replicated_keys = _LEVEL_KEYS   # not split over devices: level arrays

  def __init__(self, config):
    d, m = config.data, config.model
    if m.cell not in cells_lib.TREE_CELLS:
      raise ConfigError(f"model.cell: the trees task needs a tree cell "
                        f"{cells_lib.TREE_CELLS}, got {m.cell!r}")
    self.batch_size, self.eval_batch_size = d.batch_size, d.eval_batch_size
    self.seed, self.per_node = d.seed, bool(d.get("per_node", False))
    self.examples = None
    self.gradient_trees = d.get("gradient_trees", 200)
    if d.dataset == "keyword":
      self._keyword(d)
    elif d.dataset == "sst":
      self._sst(d)
    else:
      raise ConfigError(f"data.dataset must be 'keyword' or 'sst', got "
                        f"{d.dataset!r}")
    extra = {"activation": m.activation} if m.get("activation") else {}
    try:
      self.cell = cells_lib.make(m.cell, hidden_size=m.hidden_size, **extra)
    except (TypeError, ValueError) as e:
      raise ConfigError(f"model: {e}") from None
    self.model = TreeClassifier(vocab_size=self.vocab_size,
                                num_classes=self.num_classes, cell=self.cell,
                                per_node=self.per_node,
                                embed_init=m.get("embedding_init") or
                                "le_zuidema", remat=bool(m.remat))
    all_trees = [t for ts in self.split_trees.values() for t in ts]
    self.max_leaves = max(len(t.leaves()) for t in all_trees)
    self.max_height = max(t.height for t in all_trees)
    self._eval = jax.jit(self._logits)

  # ---------------------------------------------------------------- data
  def _keyword(self, d):
    exp = {"length": keyword_trees.length_experiment,
           "depth": keyword_trees.depth_experiment}.get(d.experiment)
    if exp is None:
      raise ConfigError(f"data.experiment must be 'length' or 'depth', got "
                        f"{d.experiment!r}")
    try:
      splits = exp(d.index, seed=d.seed, scale=d.scale)
    except ValueError as e:
      raise ConfigError(f"data.index={d.index}: {e}") from None
    self.examples = splits
    self.split_trees = {s: [_keyword_tree(ex) for ex in exs]
                        for s, exs in splits.items()}
    self.vocab, self.vocab_size = None, keyword_trees.VOCAB_SIZE
    self.num_classes = keyword_trees.NUM_CLASSES
    self.word_id = None

  def _sst(self, d):
    from sorjax.data import builders
    try:
      b = builders.prepare("sst", d.get("data_dir"), d.get("manual_dir"))
      source = b.as_data_source()
    except (FileNotFoundError, ValueError) as e:
      raise ConfigError(f"data.dataset='sst': {e}") from None
    self.split_trees, dropped = {}, {}
    for split, name in (("train", "train"), ("dev", "validation"),
                        ("test", "test")):
      ts = []
      for i, ex in enumerate(source[name]):
        text = ex["tree"].decode() if isinstance(ex["tree"], bytes) else \
            ex["tree"]
        t = trees.parse(text, source=f"sst/{name}:{i + 1}")
        if d.binary:
          t = _binary_labels(t)
          if t is None:
            dropped[split] = dropped.get(split, 0) + 1
            continue
        ts.append(t)
      self.split_trees[split] = ts
    if dropped:
      log.info("sst binary: dropped neutral-root trees %s", dropped)
    self.dropped = dropped
    self.vocab = Vocab.build((t.leaves() for t in self.split_trees["train"]),
                             eos=None, unk="<unk>")
    self.vocab_size = len(self.vocab)
    self.num_classes = 2 if d.binary else 5
    self.word_id = lambda w: self.vocab.id(w) if w in self.vocab else \
        self.vocab.unk_id

  def _schedule(self, ts, batch_size):
    W = batch_size * self.max_leaves
    return trees.encode(ts, self.word_id, unk=None, max_leaves=self.max_leaves,
                        max_height=self.max_height, max_width=W)

  def _batch(self, ts, batch_size):
    sched = self._schedule(ts, batch_size)
    return {k: np.asarray(v) for k, v in sched._asdict().items()}

  def _pad(self, ts, batch_size):
    """Pads a short batch with copies of its first tree, unlabeled."""
    fill = [_unlabeled(ts[0])] * (batch_size - len(ts))
    return list(ts) + fill

  # ---------------------------------------------------------------- train
  def init_params(self, rng):
    sched = trees.Schedule(**self._batch(self._pad(
        self.split_trees["train"][:1], 1), 1))
    return self.model.init(rng, sched)["params"]

  def init_carry(self, params):
    return ()

  def num_train_batches(self):
    return len(self.split_trees["train"]) // self.batch_size

  def train_batches(self, epoch, position):
    ts = self.split_trees["train"]
    order = np.random.default_rng((self.seed, epoch)).permutation(len(ts))
    start = (position or {}).get("batch", 0)
    for i in range(start, self.num_train_batches()):
      idx = order[i * self.batch_size:(i + 1) * self.batch_size]
      yield self._batch([ts[j] for j in idx], self.batch_size), {
          "batch": i + 1}

  def _logits(self, params, batch):
    return self.model.apply({"params": params}, trees.Schedule(**batch))

  def loss(self, params, carry, batch, rng, temperature, train):
    logits = self._logits(params, batch)
    loss, acc = loss_and_accuracy(logits, trees.Schedule(**batch))
    return loss, (carry, {"accuracy": acc})

  def epoch_metrics(self, params, epoch):
    """Le & Zuidema 3.3: median ||dJ/dx_keyword|| / ||dJ/dx_root|| per
    keyword depth over (up to) data.gradient_trees training trees, recorded
    after every epoch (keyword task only)."""
    if self.examples is None or not self.gradient_trees:
      return {}
    from sorjax.analysis.tree_gradients import tree_ratios
    depth, num, den = tree_ratios(self, params, "train", self.gradient_trees)
    with np.errstate(divide="ignore", invalid="ignore"):
      ratio = num / den
    out = {}
    for d in np.unique(depth):
      r = ratio[(depth == d) & np.isfinite(ratio)]
      if r.size:
        out[f"grad_ratio_depth_{int(d)}"] = float(np.median(r))
    return out

  # ---------------------------------------------------------------- eval
  def eval_splits(self):
    return ("dev", "test")

  def predictions(self, params, split):
    """Yields (trees of the batch, logits) over a split."""
    ts = self.split_trees[split]
    B = self.eval_batch_size
    for i in range(0, len(ts), B):
      chunk = ts[i:i + B]
      logits = self._eval(params, self._batch(self._pad(chunk, B), B))
      yield chunk, np.asarray(logits)[:len(chunk)]

  def evaluate(self, params, split, temperature):
    nll, hit, n = 0.0, 0, 0
    for chunk, logits in self.predictions(params, split):
      sched = self._schedule(self._pad(chunk, len(chunk)), len(chunk))
      labels = sched.labels if self.per_node else \
          np.take_along_axis(sched.labels, sched.root[:, None], 1)[:, 0]
      lp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), -1))
      mask = labels >= 0
      safe = np.where(mask, labels, 0)
      nll -= float(np.sum(np.take_along_axis(lp, safe[..., None], -1)[..., 0]
                          * mask))
      hit += int(np.sum((lp.argmax(-1) == safe) & mask))
      n += int(mask.sum())
    return {"loss": nll / n, "accuracy": hit / n}


def _unlabeled(t: trees.Tree) -> trees.Tree:
  if t.is_leaf:
    return trees.Tree(word=t.word)
  return trees.Tree(children=tuple(_unlabeled(c) for c in t.children))


def _binary_labels(t: trees.Tree):
  """SST 5-way -> binary (0-1 negative, 3-4 positive, 2 unlabeled); None
  when the root is neutral."""
  def relabel(n):
    lab = None if n.label is None or n.label == "2" else (
        "0" if n.label in ("0", "1") else "1")
    if n.is_leaf:
      return trees.Tree(label=lab, word=n.word)
    return trees.Tree(label=lab, children=tuple(relabel(c)
                                                for c in n.children))
  out = relabel(t)
  return None if out.label is None else out
