"""Config -> cells and model arguments, shared by every task.

`config.model` fields:
  cell, hidden_size, num_layers      the stack (identical layers), or
  layers                             a tuple of dicts, one per layer, each
                                     with `cell`, `hidden_size` and any cell
                                     hyperparameter (mts_lstm's 3 layers)
  <cell hyperparameters>             CELL_HPARAMS below; None = cell default
  budget, intermediate_ratio         solve hidden_size (and intermediate_size
                                     = ratio * hidden) for a parameter budget
  embed_size, embedding, dropouts,   RecurrentTrunk / LanguageModel fields
  locked_dropout, tie_embedding, tie_projection, remat, unroll, hoist,
  fused_grad
"""

from __future__ import annotations

from typing import Any, Callable

import ml_collections
from ml_collections.config_dict import FieldReference

from sorjax import budget as budget_lib
from sorjax import cells as cells_lib
from sorjax.checks import check_bool, check_int, check_number

CELL_HPARAMS = ("activation", "forget_bias", "intermediate_size", "use_D",
                "use_E", "general", "candidate_activation", "num_cells",
                "num_matrices", "learn_embedding", "timescales",
                "bias_init")
TRUNK_FIELDS = ("embed_size", "embedding", "embedding_dropout",
                "input_dropout", "hidden_dropout", "output_dropout",
                "locked_dropout", "weight_drop", "remat", "unroll", "hoist",
                "fused_grad")


class ConfigError(ValueError):
  """A config that cannot run; raised before anything is compiled."""


def check_ints(d, minimums: dict[str, int], optional=(),
               section: str = "data") -> None:
  """Each field of `minimums` an int >= its minimum (None allowed for those
  in `optional`), else a ConfigError naming `section.field`."""
  for name, low in minimums.items():
    check_int(f"{section}.{name}", d.get(name), low,
              optional=name in optional, error=ConfigError)


def check_bools(d, names, section: str = "data") -> None:
  for name in names:
    if name in d:
      check_bool(f"{section}.{name}", d[name], error=ConfigError)


def check_scale(d) -> None:
  """data.scale: the fraction of each split's examples, in (0, 1]."""
  check_number("data.scale", d.get("scale", 1.0), "in (0, 1]",
               lambda v: 0 < v <= 1, error=ConfigError)


# The batching fields every padded-sequence task reads from config.data.
BATCH_FIELDS = {"seed": 0, "batch_size": 1, "eval_batch_size": 1}


def model_config(**overrides) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(dict(
      cell="lstm", hidden_size=64, num_layers=1, layers=None,
      budget=None, budget_tol=0.01, intermediate_ratio=None,
      embed_size=32, embedding="learned", embedding_init=None,
      embedding_dropout=0.0, input_dropout=0.0, hidden_dropout=0.0,
      output_dropout=0.0, locked_dropout=False, weight_drop=0.0,
      activation_reg=0.0, temporal_activation_reg=0.0,
      tie_embedding=False, head_units=None, head_init=None,
      # remat: False, True or "dots"; typed `object` so that a command
      # line can give any of them (a bool field refuses "dots")
      tie_projection=False, remat=FieldReference(False, field_type=object),
      unroll=None, hoist=True,
      fused_grad=None,
      **{k: None for k in CELL_HPARAMS}))
  if overrides.get("layers"):  # each layer names its own cell and size
    overrides = {"cell": None, "hidden_size": None, **overrides}
  for k, v in overrides.items():
    if k not in c:
      raise ConfigError(f"model_config: unknown field {k!r}")
    c[k] = v
  return c


def check_layers(m: ml_collections.ConfigDict) -> None:
  """With model.layers set, the uniform stack's fields (cell, hidden_size,
  num_layers and the cell hyperparameters) are not read: one set anyway
  (an override meant for the layers) is a ConfigError naming it."""
  layers = m.get("layers")
  if not layers:
    return
  for k in ("cell", "hidden_size", *CELL_HPARAMS):
    if m.get(k) is not None:
      raise ConfigError(
          f"model.{k}={m[k]!r} is read for a uniform stack, and "
          f"model.layers sets each of its {len(layers)} layers: give "
          f"model.layers[i].{k}, or leave model.{k} None")
  if m.get("num_layers", 1) not in (1, len(layers)):
    raise ConfigError(
        f"model.num_layers={m.num_layers}: model.layers holds "
        f"{len(layers)} layers")


def _make_cell(layer: dict, where: str):
  name = layer.get("cell")
  if name not in cells_lib.names():
    raise ConfigError(f"{where}.cell: unknown cell {name!r}; known cells: "
                      f"{', '.join(cells_lib.sequence_names())}")
  if name in cells_lib.TREE_CELLS:
    raise ConfigError(f"{where}.cell: {name!r} is a tree cell; use the "
                      "'trees' task")
  kwargs = {k: tuple(v) if isinstance(v, list) else v
            for k, v in layer.items() if k != "cell" and v is not None}
  try:
    return cells_lib.make(name, **kwargs)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"{where}: {e}") from None


def make_cells(m: ml_collections.ConfigDict, hidden_size: int | None = None,
               intermediate_size: int | None = None) -> tuple:
  """The cells of config.model (hidden/intermediate sizes overridable)."""
  if m.layers:
    return tuple(_make_cell(dict(layer), f"model.layers[{l}]")
                 for l, layer in enumerate(m.layers))
  check_int("model.num_layers", m.num_layers, 1, error=ConfigError)
  layer = {"cell": m.cell, "hidden_size": hidden_size or m.hidden_size,
           **{k: m.get(k) for k in CELL_HPARAMS}}
  if intermediate_size is not None:
    layer["intermediate_size"] = intermediate_size
  return tuple(_make_cell(layer, "model") for _ in range(m.num_layers))


ACTIVATION_REGS = ("activation_reg", "temporal_activation_reg")


def activation_regs(m: ml_collections.ConfigDict) -> tuple[float, float]:
  """(alpha, beta) of AWD-LSTM's activation and temporal activation
  regularisation, checked (0 when an older config.json lacks them)."""
  out = []
  for name in ACTIVATION_REGS:
    v = check_number(f"model.{name}", m.get(name, 0.0), ">= 0",
                     lambda v: v >= 0, error=ConfigError)
    out.append(float(v))
  return tuple(out)


LM_ONLY_FIELDS = ("tie_embedding", "tie_projection")


HEAD_FIELDS = ("head_units", "head_init")


def head_fields(m: ml_collections.ConfigDict) -> dict[str, Any]:
  """DyckModel's head_units / head_init from config.model (a run written
  before they existed read every unit, flax's default init)."""
  return {k: m.get(k) for k in HEAD_FIELDS}


def refuse_head_fields(m: ml_collections.ConfigDict, task: str) -> None:
  """ConfigError for the Dyck heads' fields set on another task's model,
  which does not read them."""
  for k in HEAD_FIELDS:
    if m.get(k) is not None:
      raise ConfigError(f"model.{k}={m[k]!r} is read by the Dyck tasks' "
                        f"heads only, not the {task} task's model: leave it "
                        "None")


def refuse_lm_fields(m: ml_collections.ConfigDict, task: str) -> None:
  """ConfigError for the language model's output-layer ties set on another
  task's model, which does not read them."""
  for k in LM_ONLY_FIELDS:
    if m.get(k):
      raise ConfigError(f"model.{k}={m[k]!r} is read by the lm task only "
                        f"(its LanguageModel ties its output layer); the "
                        f"{task} task's model does not: leave it False")


def with_fields(saved: dict, fields: dict[str, Any]) -> dict:
  """`saved` (a config as nested dicts) with each dotted path of `fields`
  set, sections copied, not changed in place."""
  out = dict(saved)
  for path, value in fields.items():
    *parents, leaf = path.split(".")
    node = out
    for part in parents:
      node[part] = dict(node.get(part) or {})
      node = node[part]
    node[leaf] = value
  return out


def field_at(saved: dict, path: str) -> Any:
  """The value at dotted `path` of `saved` (a config as nested dicts)."""
  for part in path.split("."):
    saved = saved[part]
  return saved


def unread_as_trained(saved: dict) -> tuple[dict, dict[str, str]]:
  """For `tasks.as_trained`: fields of a saved config that no version read
  with its other settings, and that this one refuses when set (each
  naming the default to leave it at): they read as that default, which
  is what the run trained with. Refused, such a run could be neither
  restored nor resumed: a config.json edited back to the default is not
  the config its checkpoints were trained with. Every task: optimizer and
  schedule fields the chosen ones do not read, a token model's
  hidden_dropout with one layer (it drops between layers), and the
  uniform stack's fields beside model.layers (`check_layers`)."""
  from sorjax.training.config import base_config
  from sorjax.training.optim import OPTIMIZER_READS, SCHEDULE_READS
  fields, why = {}, {}

  def unread(path, value, default, reader):
    fields[path] = default
    why[path] = (f"config.json's {value!r}, which {reader} does not read "
                 "and no version did")

  optim, defaults = saved.get("optim") or {}, base_config().optim
  for reads, chosen in ((OPTIMIZER_READS, optim.get("name")),
                        (SCHEDULE_READS, optim.get("schedule", "constant"))):
    if chosen not in reads:     # refused as unknown, not as unread
      continue
    for k in sorted({k for v in reads.values() for k in v}
                    - set(reads[chosen])):
      if optim.get(k) is not None and optim[k] != defaults.get(k):
        unread(f"optim.{k}", optim[k], defaults.get(k), f"{chosen!r}")
  m = saved.get("model") or {}
  if (saved.get("task") != "trees" and m.get("hidden_dropout")
      and len(m.get("layers") or ()) <= 1 and m.get("num_layers", 1) == 1):
    unread("model.hidden_dropout", m["hidden_dropout"], 0.0,
           "a one-layer stack")
  if m.get("layers"):
    for k in ("cell", "hidden_size", *CELL_HPARAMS):
      if m.get(k) is not None:
        unread(f"model.{k}", m[k], None, "a model.layers stack")
    if m.get("num_layers", 1) not in (1, len(m["layers"])):
      unread("model.num_layers", m["num_layers"], 1, "a model.layers stack")
  return (with_fields(saved, fields), why) if fields else (saved, {})


def trunk_kwargs(m: ml_collections.ConfigDict,
                 activation_reg: bool = False) -> dict[str, Any]:
  """The RecurrentTrunk fields of model config m. activation_reg: whether
  the task reads model.activation_reg / temporal_activation_reg (the LM
  task); elsewhere a non-zero value is an error, not silently ignored."""
  if not activation_reg and any(activation_regs(m)):
    raise ConfigError(
        "model.activation_reg / model.temporal_activation_reg are read by "
        "the lm task only; set them to 0 for this task")
  # Fields missing from an older run's config.json take the model default.
  kw = {k: m[k] for k in TRUNK_FIELDS if k in m}
  init = m.get("embedding_init")
  if init is not None:
    from sorjax.models.stack import EMBED_INITS
    if init not in EMBED_INITS:
      raise ConfigError(
          f"model.embedding_init must be None or one of {EMBED_INITS} for "
          f"the token models (None: N(0, 1/E); the trees task takes "
          f"'le_zuidema' or 'normal'), got {init!r}")
    if kw.get("embedding", "learned") != "learned":
      raise ConfigError(
          f"model.embedding_init={init!r} initialises a learned table; "
          f"model.embedding is {kw['embedding']!r}")
    kw["embed_init"] = init
  if kw.get("remat", False) not in (False, True, "dots") or isinstance(
      kw.get("remat"), (int, float)) and not isinstance(kw["remat"], bool):
    raise ConfigError(f"model.remat must be False, True or \"dots\", got "
                      f"{kw['remat']!r}")
  if not isinstance(kw["locked_dropout"], bool):
    kw["locked_dropout"] = tuple(kw["locked_dropout"])
  if kw["embedding"] != "learned":
    kw["embed_size"] = None
  return kw


def build_model(m: ml_collections.ConfigDict,
                factory: Callable[[tuple], Any]):
  """factory(cells) -> model; with model.budget set, hidden_size (and
  intermediate_size at model.intermediate_ratio) are solved to meet it
  within model.budget_tol (relative; 1% by default)."""
  if m.budget is None:
    return _checked(factory, make_cells(m))
  if m.layers:
    raise ConfigError("model.budget solves one uniform stack; it cannot be "
                      "combined with model.layers")
  ratio = m.intermediate_ratio
  for name, v in (("budget", m.budget), ("intermediate_ratio", ratio)):
    check_number(f"model.{name}", v, "> 0", lambda v: v > 0, optional=True,
                 error=ConfigError)
  tol = m.get("budget_tol", 0.01)  # older config.json files lack the field
  check_number("model.budget_tol", tol, "in (0, 1)", lambda v: 0 < v < 1,
               error=ConfigError)
  try:
    if ratio is None:
      return budget_lib.solve(lambda H: _checked(factory, make_cells(m, H)),
                              m.budget, tol=tol)
    return budget_lib.solve(
        lambda H, M: _checked(factory, make_cells(m, H, M)), m.budget,
        ratio=ratio, tol=tol)
  except ValueError as e:
    if isinstance(e, ConfigError):
      raise
    raise ConfigError(f"model.budget={m.budget:,}: {e}") from None


def _checked(factory, cells):
  try:
    return factory(cells)
  except ConfigError:  # already names its field
    raise
  except ValueError as e:
    raise ConfigError(f"model: {e}") from None
