"""Tree classification: Le & Zuidema's keyword task (3) and SST.

data.dataset = "keyword": data.experiment "length" (dataset i: 10i-9..10i
leaves) or "depth" (keyword at depth i or i+1, 21..30 leaves); the label is
the keyword // 100 (10 classes) and only the root is labelled.
data.dataset = "sst": the Stanford Sentiment Treebank's binary parse trees,
5 classes (or data.binary: negative 0-1 vs positive 3-4, neutral dropped
and counted); the root label is the target, or every node's with
data.per_node.

Batches are chunked schedules (`sorjax.trees.encode`) of one shape per
batch size: L = the largest tree's leaves, T = the largest height over all
splits, W = ceil(B (L - 1) / T), the narrowest width whose T steps can hold
B of the largest trees; so the train step compiles once. A batch that
needs more steps at that width (none in the keyword data sets) doubles W
for the rest of the run: one more compilation. Trees are looked up and
numbered once (`trees.tree_arrays`); the dev / test batches are encoded
once and evaluated by one jitted function that returns the sums.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np

from sorjax import cells as cells_lib
from sorjax import trees
from sorjax.data import keyword_trees
from sorjax.data.vocab import Vocab
from sorjax.models.tree_classifier import TreeClassifier, loss_and_accuracy
from sorjax.training.config import fields_set
from sorjax.training.tasks.common import BATCH_FIELDS, CELL_HPARAMS, \
    ConfigError, check_bools, check_ints, check_scale, field_at, \
    model_config, with_fields

log = logging.getLogger(__name__)
_STEP_KEYS = ("node", "left", "right", "step_mask")


def _keyword_tree(ex) -> trees.Tree:
  t = trees.Tree.from_nested(ex.tree)
  return trees.Tree(label=str(ex.label), children=t.children, word=t.word)


# The model fields the trees task reads: the tree cell (model.cell,
# hidden_size and the CELL_HPARAMS that are set), the word vectors'
# initialiser and remat. Every other one must stay at its default, except
# `sorjax.unroll`'s speed options (unroll, hoist, fused_grad): a tree cell
# runs no sequence loop, they cannot change a trees run, and trees runs
# written before 29237a7 hold unroll=1, the default then.
TREE_MODEL_FIELDS = ("cell", "hidden_size", "embedding_init", "remat",
                     "unroll", "hoist", "fused_grad")


def _check_unread_model_fields(m) -> None:
  """ConfigError naming a model field set for the token models (a budget,
  layers, dropout, an embedding size...), which the trees task would
  otherwise ignore."""
  defaults = dict(model_config().items(), assignment=None)
  unread = fields_set(m, defaults, [k for k in defaults
                                    if k not in TREE_MODEL_FIELDS
                                    and k not in CELL_HPARAMS])
  if unread:
    k = unread[0]
    raise ConfigError(
        f"model.{k}={m[k]!r} is not read by the trees task (its model is the "
        f"tree cell model.cell of model.hidden_size over word vectors of "
        f"the same size); leave it at its default {defaults[k]!r}")


def _trees_as_trained(saved: dict) -> tuple[dict, dict[str, str]]:
  """`tasks.as_trained` for the trees task: the fields it refuses as not
  read (`_check_unread_model_fields`, a cell hyperparameter the tree cell
  lacks, the keyword generator's fields with SST, data.binary with the
  keyword trees), which no version read (runs before session 39 passed
  the tree cell no hyperparameter but activation), as their defaults."""
  m, d = saved.get("model") or {}, saved.get("data") or {}
  defaults = dict(model_config().items(), assignment=None)
  fields = {f"model.{k}": defaults[k] for k in fields_set(
      m, defaults, [k for k in defaults if k not in TREE_MODEL_FIELDS
                    and k not in CELL_HPARAMS])}
  if m.get("cell") in cells_lib.TREE_CELLS:
    has = {f.name for f in dataclasses.fields(cells_lib.cell_class(m["cell"]))}
    fields.update({f"model.{k}": None for k in CELL_HPARAMS
                   if m.get(k) is not None and k not in has})
  if d.get("dataset") == "sst":
    fields.update({f"data.{k}": v for k, v in _GENERATOR.items()
                   if k in fields_set(d, _GENERATOR)})
  elif d.get("binary"):
    fields["data.binary"] = False
  if not fields:
    return saved, {}
  why = {p: f"config.json's {field_at(saved, p)!r}, "
            "which the trees task does not read and never did"
         for p in fields}
  return with_fields(saved, fields), why


# The keyword trees' generator's fields, with their defaults: not read for
# SST, which is read whole.
_GENERATOR = {"experiment": "length", "index": 1, "scale": 1.0}


class TreeTask:
  name = "trees"
  as_trained = staticmethod(_trees_as_trained)
  aux = frozenset()   # its models take no aux inputs (no temperature)
  replicated_keys = _STEP_KEYS   # not split over devices: schedule arrays

  def __init__(self, config):
    d, m = config.data, config.model
    if m.cell not in cells_lib.TREE_CELLS:
      raise ConfigError(f"model.cell: the trees task needs a tree cell "
                        f"{cells_lib.TREE_CELLS}, got {m.cell!r}")
    check_ints(d, {**BATCH_FIELDS, "gradient_trees": 0},
               optional=("gradient_trees",))   # None: no gradient ratios
    check_bools(d, ("binary", "per_node"))
    check_scale(d)
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
    if len(self.split_trees["train"]) < self.batch_size:  # no full batch
      raise ConfigError(f"data.batch_size={self.batch_size} exceeds the "
                        f"{len(self.split_trees['train'])} training trees")
    _check_unread_model_fields(m)
    # the cell's hyperparameters that are set (a tree cell refuses those it
    # does not have, e.g. tree_rnn's forget_bias), as the token models' cells
    extra = {k: m[k] for k in CELL_HPARAMS if m.get(k) is not None}
    try:
      self.cell = cells_lib.make(m.cell, hidden_size=m.hidden_size, **extra)
    except (TypeError, ValueError) as e:
      raise ConfigError(f"model: {e}") from None
    self.model = TreeClassifier(vocab_size=self.vocab_size,
                                num_classes=self.num_classes, cell=self.cell,
                                per_node=self.per_node,
                                embed_init=m.get("embedding_init") or
                                "le_zuidema", remat=bool(m.remat))
    self.split_arrays = {s: [trees.tree_arrays(t, self.word_id) for t in ts]
                         for s, ts in self.split_trees.items()}
    self._arrays_of = {id(t): a for s, ts in self.split_trees.items()
                       for t, a in zip(ts, self.split_arrays[s])}
    all_arrays = [a for arrs in self.split_arrays.values() for a in arrs]
    self.max_leaves = max(len(a.tokens) for a in all_arrays)
    self.max_steps = max(max(int(a.height[-1]) for a in all_arrays), 1)
    self._widths = {}         # batch size -> W
    self._eval_batches = {}   # split -> encoded batches, built once
    self._eval = jax.jit(self._eval_sums)
    self._eval_logits = jax.jit(self._logits)
    self._init = jax.jit(self._init_params)

  # ---------------------------------------------------------------- data
  def _keyword(self, d):
    if d.get("binary"):
      raise ConfigError("data.binary=True applies to data.dataset='sst' "
                        "(positive / negative roots) only; the keyword "
                        "trees have 10 classes")
    exp = {"length": keyword_trees.length_experiment,
           "depth": keyword_trees.depth_experiment}.get(d.experiment)
    if exp is None:
      raise ConfigError(f"data.experiment must be 'length' or 'depth', got "
                        f"{d.experiment!r}")
    try:
      splits = exp(d.index, seed=d.seed, scale=d.scale)
    except (ValueError, RuntimeError) as e:   # RuntimeError: too rare
      raise ConfigError(f"data.index={d.index}: {e}") from None
    self.examples = splits
    self.split_trees = {s: [_keyword_tree(ex) for ex in exs]
                        for s, exs in splits.items()}
    self.vocab, self.vocab_size = None, keyword_trees.VOCAB_SIZE
    self.num_classes = keyword_trees.NUM_CLASSES
    self.word_id = None

  def _sst(self, d):
    from sorjax.data import builders
    unread = fields_set(d, _GENERATOR)   # the keyword trees' generator's
    if unread:
      k = unread[0]
      raise ConfigError(f"data.{k}={d[k]!r} applies to data.dataset="
                        f"'keyword' only; SST is read whole (leave it at "
                        f"{_GENERATOR[k]!r})")
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

  def _arrays(self, t) -> trees.TreeArrays:
    """A tree's arrays: looked up once for the splits' trees."""
    if isinstance(t, trees.TreeArrays):
      return t
    a = self._arrays_of.get(id(t))
    return a if a is not None else trees.tree_arrays(t, self.word_id)

  def _schedule(self, ts, batch_size):
    """The chunked schedule of a batch of `batch_size` trees (or arrays)."""
    arrs = [self._arrays(t) for t in ts]
    L, T = self.max_leaves, self.max_steps
    W = self._widths.setdefault(batch_size,
                                max(1, -(-batch_size * (L - 1) // T)))
    while True:
      try:
        return trees.encode(arrs, max_leaves=L, max_steps=T, width=W,
                            check_arrays=False)  # tree_arrays made them
      except trees.ScheduleError:
        if W >= batch_size * L:   # every ready node runs: steps = height,
          raise                   # so only a tree taller than T fails
        W = self._widths[batch_size] = min(2 * W, batch_size * L)
        log.info("trees: a batch of %d needs more than %d steps; width %d "
                 "from now on (one more compilation)", batch_size, T, W)

  def _batch(self, ts, batch_size):
    sched = self._schedule(ts, batch_size)
    return {k: np.asarray(v) for k, v in sched._asdict().items()}

  def _pad(self, ts, batch_size):
    """Pads a short batch with copies of its first tree, unlabeled."""
    first = ts[0]
    if isinstance(first, trees.TreeArrays):
      fill = first._replace(labels=np.full_like(first.labels, -1))
    else:
      fill = _unlabeled(first)
    return list(ts) + [fill] * (batch_size - len(ts))

  # ---------------------------------------------------------------- train
  def init_params(self, rng):
    # The shapes do not depend on the trees: a one-leaf tree runs no step.
    return self._init(rng, trees.encode([trees.Tree(word=0)])._asdict())

  def _init_params(self, rng, batch):   # one compilation, not one per op
    return self.model.init(rng, trees.Schedule(**batch))["params"]

  def init_carry(self, params):
    return ()

  def num_train_batches(self):
    return len(self.split_trees["train"]) // self.batch_size

  def train_batches(self, epoch, position):
    ts = self.split_arrays["train"]
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

  def _eval_batches_of(self, split):
    """[(trees in the batch, batch)] over a split, encoded once; the last
    batch is padded with unlabeled copies (fixed shapes)."""
    if split not in self._eval_batches:
      arrs, B = self.split_arrays[split], self.eval_batch_size
      self._eval_batches[split] = [
          (len(arrs[i:i + B]), self._batch(self._pad(arrs[i:i + B], B), B))
          for i in range(0, len(arrs), B)]
    return self._eval_batches[split]

  def predictions(self, params, split):
    """Yields (trees of the batch, logits) over a split."""
    ts = self.split_trees[split]
    start = 0
    for n, batch in self._eval_batches_of(split):
      yield ts[start:start + n], np.asarray(
          self._eval_logits(params, batch))[:n]
      start += n

  def _eval_sums(self, params, batch):
    """(summed NLL, hits, targets) of one batch; unlabeled slots and the
    padding copies do not count."""
    sched = trees.Schedule(**batch)
    logits = self._logits(params, batch)
    labels = sched.labels if self.per_node else jnp.take_along_axis(
        sched.labels, sched.root[:, None], 1)[:, 0]
    mask = labels >= 0
    safe = jnp.where(mask, labels, 0)
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
    nll = -jnp.take_along_axis(lp, safe[..., None], -1)[..., 0]
    hit = (jnp.argmax(logits, -1) == safe) & mask
    return (jnp.sum(jnp.where(mask, nll, 0.0)), jnp.sum(hit),
            jnp.sum(mask))

  def metric_names(self) -> tuple[str, ...]:
    """What `evaluate` returns (selection.metric is checked against it)."""
    return ("loss", "accuracy")

  def evaluate(self, params, split, temperature):
    sums = [self._eval(params, batch)
            for _, batch in self._eval_batches_of(split)]
    nll, hit, n = (float(sum(np.asarray(x) for x in xs))
                   for xs in zip(*jax.device_get(sums)))
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
