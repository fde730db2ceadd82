"""Named analyses of a restored run, writing JSON and figures.

    run = sorjax.restore("/tmp/run")
    run_analyses(run, ["perplexity", "ldpa"])   # -> RUN/analysis/*.json, *.png

`experiments/analyze.py` is the command line over this. Each analysis is
one function of `sorjax.analysis.*` (usable alone in a notebook) plus its
plot; see ANALYSES for the names and what they need.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, NamedTuple

from sorjax.analysis import (attention, characters, dyck, minimal_pairs,
                             perplexity, timescales, tree_gradients)
from sorjax.analysis.common import (MULTI_CELL_LSTMS, AnalysisError,
                                    Progress, check_split, fail, output_dir,
                                    require_layers, require_task, temperature,
                                    write_json)
from sorjax.analysis.common import splits as task_splits
from sorjax.checks import write_text
from sorjax.runs import check_temperature


@dataclasses.dataclass
class Options:
  """Inputs of the analyses (each reads the ones it needs)."""
  split: str | None = None          # default: the task's test split
  compare: Any = None               # a second Run (frequency, minimal pairs,
                                    # token_losses, perplexity)
  labels: tuple[str, str] = ("run", "other")
  pairs: tuple[str, ...] = ()       # JSONL files / dirs, or "blimp"
  category_field: str = "UID"
  sentence: str | None = None       # token_losses; attention_heatmap text
  temperature: float | None = None  # default: the run's evaluation tau
  num_resamples: int = 10_000
  seed: int = 0
  max_tokens: int | None = None
  max_sequences: int | None = None
  max_trees: int | None = 1000
  position: int = 0                 # word_ablation
  data_dir: str | None = None       # blimp's TFDS data_dir
  progress: bool = False            # minimal_pairs: a line to stderr every
                                    # 30 s (BLiMP's 67k pairs: ~20 min)


def _path(out, name):
  return os.path.join(out, name)


def _json(out, name, res, src):
  """Writes `res` with the `source` that produced it (run, step, tau)."""
  return write_json(_path(out, name), {**res, "source": src})


def _runs(run, o):
  return [run] + ([o.compare] if o.compare is not None else [])


# ---------------------------------------------------------------- analyses
# Each: fn(run, out, options, source, prepared) -> written files, and
# check(runs, options) -> prepared, run on every analysis before any fn.

def _perplexity(run, out, o, src, _):
  res = {"run": perplexity.perplexity(run, o.split, o.temperature)}
  if o.compare is not None:
    res["other"] = perplexity.perplexity(o.compare, o.split, o.temperature)
  return [_json(out, "perplexity.json", res, src)]


def _check_perplexity(runs, o):
  for r in runs:
    require_task("perplexity", r, ("lm", "dyck_lm"))
    check_split("perplexity", r, o.split)


def _ldpa_splits(run, o):
  return (o.split,) if o.split else tuple(
      s for s in ("dev", "test") if s in task_splits(run))


def _ldpa(run, out, o, src, _):
  res = dyck.ldpa(run, _ldpa_splits(run, o), o.temperature)
  return [_json(out, "ldpa.json", res, src),
          dyck.plot_ldpa(res, _path(out, "ldpa.png"))]


def _check_ldpa(runs, o):
  require_task("ldpa", runs[0], ("dyck_lm", "dyck_closing"))
  for s in _ldpa_splits(runs[0], o):
    check_split("ldpa", runs[0], s)


def _pcfg(run, out, o, src, _):
  res = dyck.pcfg_timescales(run, o.split, tau=o.temperature)
  return [_json(out, "pcfg_timescales.json", res, src),
          dyck.plot_pcfg_timescales(res, _path(out, "pcfg_timescales.png"))]


def _check_pcfg(runs, o):
  require_task("pcfg_timescales", runs[0], ("dyck_pcfg",))
  check_split("pcfg_timescales", runs[0], o.split)


def _frequency(run, out, o, src, _):
  if o.compare is None:
    res = perplexity.frequency(run, o.split, o.temperature)
  else:
    res = perplexity.compare_frequency(
        run, o.compare, o.split, o.num_resamples, seed=o.seed,
        tau_a=o.temperature, tau_b=o.temperature)
  return [_json(out, "frequency.json", res, src),
          perplexity.plot_frequency(res, _path(out, "frequency.png"),
                                    o.labels)]


def _check_frequency(runs, o):
  for r in runs:
    require_task("frequency", r, ("lm",))
    check_split("frequency", r, o.split)


def _timescales(run, out, o, src, _):
  res = timescales.estimate(run, o.split, o.temperature, o.max_tokens,
                            o.max_sequences)
  return [_json(out, "timescales.json", res, src),
          timescales.plot_scatter(res, _path(out, "timescales_scatter.png")),
          timescales.plot_ks(res, _path(out, "timescales_ks.png"))]


def _forget_layers(name):
  def check(runs, o):
    timescales._layers(name, runs[0])
    check_split(name, runs[0], o.split)
  return check


def _forget_heatmap(run, out, o, src, _):
  res = timescales.forget_heatmap(run, o.split, tau=o.temperature)
  return [_json(out, "forget_heatmap.json", res, src),
          timescales.plot_forget_heatmap(res,
                                         _path(out, "forget_heatmap.png"))]


def _ablation(run, out, o, src, _):
  res = timescales.word_ablation(run, o.split, o.position,
                                 tau=o.temperature, max_tokens=o.max_tokens,
                                 max_sequences=o.max_sequences or 256)
  return [_json(out, "word_ablation.json", res, src),
          timescales.plot_ablation(res, _path(out, "word_ablation.png"))]


def _angles(run, out, o, src, _):
  res = attention.principal_angles(run)
  return [_json(out, "principal_angles.json", res, src),
          attention.plot_principal_angles(res,
                                          _path(out, "principal_angles.png"))]


def _check_attention(name):
  def check(runs, o):
    require_task(name, runs[0], attention.TOKEN_TASKS)
    require_layers(name, runs[0], MULTI_CELL_LSTMS, attention.WHAT)
    if name == "attention_heatmap":
      check_split(name, runs[0], o.split)
      if o.sentence is not None:
        _check_text(name, runs[0], o.sentence)
  return check


def _check_text(name, run, text):
  if not hasattr(run.task, "encode_text"):
    raise fail(name, run, f"--sentence needs a run of a text task (lm); "
               f"this run's task is {run.task.name!r}")
  run.encode(text)


def _heatmap(run, out, o, src, _):
  res = attention.attention_map(run, o.split, text=o.sentence,
                                tau=o.temperature)
  html_path = write_text(_path(out, "attention_heatmap.html"),
                         attention.heatmap_html(res))
  return [_json(out, "attention_heatmap.json", res, src), html_path,
          attention.plot_heatmap(res, _path(out, "attention_heatmap.png"))]


def _gradient_ratio(run, out, o, src, _):
  res = tree_gradients.gradient_ratio(run, o.split, o.max_trees)
  return [_json(out, "gradient_ratio.json", res, src),
          tree_gradients.plot_gradient_ratio(
              res, _path(out, "gradient_ratio.png"))]


def _check_gradient_ratio(runs, o):
  tree_gradients.require_keyword_trees(runs[0])
  check_split("gradient_ratio", runs[0], o.split, default="train")


def _read_pairs(o, strict_category):
  """The pairs of --pairs: files / directories, then BLiMP if named."""
  if not o.pairs:
    raise AnalysisError("minimal_pairs: give --pairs (JSONL files or "
                        "directories of them, or 'blimp')")
  files = [p for p in o.pairs if p != "blimp"]
  pairs = minimal_pairs.read_pairs(files, o.category_field,
                                   strict_category) if files else []
  if "blimp" in o.pairs:
    pairs += minimal_pairs.blimp_pairs(data_dir=o.data_dir)
  return pairs


def _minimal_pairs(run, out, o, src, pairs):
  runs = _runs(run, o)
  progress = (Progress("minimal_pairs", "sentences") if o.progress
              else None)
  res = minimal_pairs.compare(runs, pairs, tau=o.temperature,
                              progress=progress)
  return [_json(out, "minimal_pairs.json", res, src),
          minimal_pairs.plot_categories(res["results"],
                                        list(o.labels[:len(runs)]),
                                        _path(out, "minimal_pairs.png"))]


def _check_minimal_pairs(runs, o, strict_category=False):
  for r in runs:
    require_task("minimal_pairs", r, ("lm",))
  pairs = _read_pairs(o, strict_category)
  for r in runs:        # a sentence a run cannot encode fails here
    minimal_pairs.encode_pairs(r, pairs, minimal_pairs.normalisation(r))
  return pairs


def _token_losses(run, out, o, src, _):
  runs = _runs(run, o)
  res = [minimal_pairs.sentence_log_probs(r, o.sentence, tau=o.temperature)
         for r in runs]
  return [_json(out, "token_losses.json",
                {"runs": [r.workdir for r in runs], "results": res}, src),
          minimal_pairs.plot_sentence(res, list(o.labels[:len(runs)]),
                                      _path(out, "token_losses.png"))]


def _check_token_losses(runs, o):
  if not o.sentence:
    raise AnalysisError("token_losses: give --sentence")
  for r in runs:
    require_task("token_losses", r, ("lm",))
    minimal_pairs.encode_sentence(r, o.sentence)


def _word_position(run, out, o, src, _):
  res = characters.position_losses(run, o.split, tau=o.temperature)
  ex = characters.prediction_examples(run, o.split, tau=o.temperature)
  write_text(_path(out, "prediction_examples.txt"), "".join(
      f"{e['text']}\n{e['predicted']}\n\n" for e in ex["examples"]))
  return [_json(out, "word_position.json", res, src),
          characters.plot_positions(res, _path(out, "word_position.png")),
          _json(out, "prediction_examples.json", ex, src),
          _path(out, "prediction_examples.txt"),
          characters.plot_examples(ex, _path(out,
                                             "prediction_examples.png"))]


def _check_word_position(runs, o):
  characters.require_chars("word_position", runs[0])
  check_split("word_position", runs[0], o.split)
  characters.example_lines(runs[0], o.split)  # a line long enough to show


class Spec(NamedTuple):
  fn: Callable           # (run, out, options, source, prepared) -> files
  doc: str
  check: Callable        # (runs, options) -> prepared; raises if it can't
  reads: frozenset       # the Options fields it reads


def _spec(fn, doc, check, reads=""):
  return Spec(fn, doc, check, frozenset(reads.split()))


_TAU = "split temperature "
ANALYSES: dict[str, Spec] = {
    "perplexity": _spec(_perplexity, "cross-entropy, perplexity, bits; "
                        "oracle ratio (lm, dyck_lm)", _check_perplexity,
                        _TAU + "compare"),
    "ldpa": _spec(_ldpa, "LDPA per closing distance, WCPA (dyck_lm, "
                  "dyck_closing; Lin Fig. 2)", _check_ldpa, _TAU),
    "pcfg_timescales": _spec(_pcfg, "accuracy vs maximum timescale "
                             "(dyck_pcfg; Mahto Fig. 2)", _check_pcfg, _TAU),
    "frequency": _spec(_frequency, "perplexity by training frequency; with "
                       "--compare the bootstrap CI (lm; Mahto Table 1)",
                       _check_frequency,
                       _TAU + "compare labels num_resamples seed"),
    "timescales": _spec(_timescales, "T_est per unit, scatter and KS fits "
                        "(lstm/mts_lstm layers; Mahto eq. 3, Fig. 1, 4)",
                        _forget_layers("timescales"),
                        _TAU + "max_tokens max_sequences"),
    "forget_heatmap": _spec(_forget_heatmap, "sorted forget gates of one "
                            "sequence (Mahto Fig. 5)",
                            _forget_layers("forget_heatmap"), _TAU),
    "word_ablation": _spec(_ablation, "cell-state decay after a word "
                           "ablation (Mahto Fig. 6-8)",
                           _forget_layers("word_ablation"),
                           _TAU + "position max_tokens max_sequences"),
    "principal_angles": _spec(_angles, "PABS of the S W_hh matrices "
                              "(attention/assignment LSTM; Lin Fig. 4-5)",
                              _check_attention("principal_angles")),
    "attention_heatmap": _spec(_heatmap, "tokens coloured by argmax cell "
                               "(attention LSTM; Lin Fig. 6), HTML and PNG",
                               _check_attention("attention_heatmap"),
                               _TAU + "sentence"),
    "gradient_ratio": _spec(_gradient_ratio, "||dJ/dx_keyword|| / "
                            "||dJ/dx_root|| per depth and epoch (keyword "
                            "trees; Le & Zuidema 3.3)", _check_gradient_ratio,
                            "split max_trees"),
    "minimal_pairs": _spec(_minimal_pairs, "accuracy per category on "
                           "minimal pairs, --pairs (lm; Lin Table 3, BLiMP)",
                           _check_minimal_pairs, "temperature compare labels "
                           "pairs category_field data_dir"),
    "token_losses": _spec(_token_losses, "per-token log-probabilities of "
                          "--sentence (lm; Lin sec. 5)", _check_token_losses,
                          "temperature compare labels sentence"),
    "word_position": _spec(_word_position, "loss by position in word and "
                           "prediction examples (char LMs; Maupome Fig. 2-3)",
                           _check_word_position, _TAU),
}

# --compare with these needs runs of the same task and data (their numbers
# are read side by side, token by token for frequency and token_losses).
SAME_DATA = ("perplexity", "frequency", "token_losses")
# What tells runs' data apart, per task (config.data fields that change
# the evaluated sequences).
_DYCK = ("k", "m", "preset", "num_train", "num_dev", "num_test",
         "max_length", "seed", "scale")
_DATA_FIELDS = {"lm": ("corpus", "max_eval_tokens", "eval_batch_size",
                       "test_batch_size", "documents", "folds", "fold",
                       "fold_valid_fraction", "fold_seed"),
                "dyck_lm": _DYCK, "dyck_closing": _DYCK,
                "dyck_pcfg": ("preset", "seed", "scale"),
                "trees": ("dataset", "experiment", "scale", "seed")}
_POSITIVE = ("num_resamples", "max_tokens", "max_sequences", "max_trees")
# command-line flags -> Options
ALIASES = {"compare_step": "compare", "compare_replica": "compare"}


def names() -> list[str]:
  return list(ANALYSES)


# ---------------------------------------------------------------- checks

def _check_values(o: Options) -> None:
  """Option values no analysis can use."""
  if o.temperature is not None:
    check_temperature("--temperature", o.temperature)
  for k in _POSITIVE:
    v = getattr(o, k)
    if v is not None and v < 1:
      raise AnalysisError(f"--{k} must be >= 1, got {v}")
  if o.position < 0:
    raise AnalysisError(f"--position must be >= 0, got {o.position}")
  if o.seed < 0:
    raise AnalysisError(f"--seed must be >= 0, got {o.seed}")


# What bounds the pass over a split of the analyses with max_tokens /
# max_sequences (traces.batches): an LM's tokens; lines of a documents LM
# and the Dyck tasks' sequences; word_ablation also counts an LM stream's
# windows by max_sequences.
_LIMITED = ("timescales", "word_ablation")


def _check_limits(analyses, run, given) -> None:
  """--max_tokens / --max_sequences given for a run none of the chosen
  analyses would bound by it: an AnalysisError naming the flag (the whole
  split would be read while the user thinks it was cut)."""
  task = run.task.name
  docs = task == "lm" and bool(getattr(run.task, "documents", False))
  for a in (a for a in analyses if a in _LIMITED):
    if "max_tokens" in given and task != "lm":
      raise AnalysisError(f"--max_tokens bounds an LM split's tokens; {a} "
                          f"reads this {task!r} run's split by sequences: "
                          "give --max_sequences")
    if ("max_sequences" in given and task == "lm" and not docs
        and a != "word_ablation"):
      raise AnalysisError(f"--max_sequences: {a} reads this LM run's "
                          "stream by tokens: give --max_tokens")


def _check_tau_read(run, o: Options, given) -> None:
  """--temperature is the attention softmax's tau: refused (not ignored)
  when neither run's model has one."""
  runs = [r for r in (run, o.compare) if r is not None]
  if "temperature" in given and all(hasattr(r.task, "aux") for r in runs
                                    ) and not any(
      "temperature" in r.task.aux for r in runs):
    cells = sorted({type(c).__name__ for r in runs
                    for c in getattr(r.task, "cells", ())})
    raise AnalysisError(
        f"--temperature is the attention LSTM's softmax tau; this run's "
        f"cells ({', '.join(cells) or 'none'}) have none (it is not a "
        "sampling temperature)")


def _given(o: Options) -> list[str]:
  """The inputs set to other than their defaults (`progress` is how to
  report, read by whichever analyses are long, not an input)."""
  default = Options()
  return [f.name for f in dataclasses.fields(o) if f.name != "progress"
          and getattr(o, f.name) is not getattr(default, f.name)
          and getattr(o, f.name) != getattr(default, f.name)]


def _check_given(analyses, given) -> None:
  """Every given option (flag) is read by one of `analyses`."""
  for flag in given:
    field = ALIASES.get(flag, flag)
    if not any(field in ANALYSES[a].reads for a in analyses):
      readers = [a for a, s in ANALYSES.items() if field in s.reads]
      raise AnalysisError(f"--{flag} is read by {', '.join(readers)}; not "
                          f"by {', '.join(analyses)}")


def _data(run) -> dict:
  """The fields of `_DATA_FIELDS`; one an older run's config lacks reads as
  what that run did (the task's ADDED_FIELDS), else None."""
  from sorjax.training.tasks import added_fields
  data, added = run.config.data, added_fields(run.task.name)
  return {f"data.{k}": getattr(data, k, added.get(f"data.{k}"))
          for k in _DATA_FIELDS.get(run.task.name, ())}


def describe(run, only=None) -> str:
  """The run's task and what tells its data apart ("task 'lm', data.corpus
  'ptb'"); of the data fields, those in `only` if given."""
  return ", ".join([f"task {run.task.name!r}"] + [
      f"{k} {v!r}" for k, v in _data(run).items()
      if only is None or k in only])


def _check_compare(analyses, run, other) -> None:
  same = [a for a in analyses if a in SAME_DATA]
  if other is None or not same or describe(run) == describe(other):
    return
  a, b = _data(run), _data(other)
  only = (None if run.task.name != other.task.name else
          [k for k in a if a[k] != b[k]])     # the fields that differ
  raise AnalysisError(
      f"--compare: {', '.join(same)} cannot compare runs of another task "
      f"or data: {run.workdir} has {describe(run, only)}, {other.workdir} "
      f"has {describe(other, only)}")


def check(run, analyses, o: Options, given=None) -> dict:
  """Checks that every analysis applies to `run` (and o.compare) before
  any runs; returns what each prepared (minimal_pairs: its pairs)."""
  given = _given(o) if given is None else list(given)
  for name, r in (("run", run), ("compare", o.compare)):
    if r is not None and not hasattr(r, "task"):   # e.g. a workdir string
      raise AnalysisError(f"{name} must be a run (sorjax.restore(workdir)),"
                          f" got {type(r).__name__} {r!r}")
  _check_values(o)
  _check_given(analyses, given)
  _check_limits(analyses, run, given)
  _check_tau_read(run, o, given)
  _check_compare(analyses, run, o.compare)
  prepared = {}
  for a in analyses:
    spec = ANALYSES[a]
    runs = _runs(run, o) if "compare" in spec.reads else [run]
    if a == "minimal_pairs":
      prepared[a] = spec.check(runs, o, "category_field" in given)
    else:
      prepared[a] = spec.check(runs, o)
  return prepared


def _source(name, run, o) -> dict:
  """What produced an analysis' results: run, step, replica, tau."""
  reads = ANALYSES[name].reads
  runs = _runs(run, o) if "compare" in reads else [run]
  out = []
  for r in runs:
    d = {"workdir": r.workdir, "step": getattr(r, "step", None),
         "replica": getattr(r, "replica", None),
         "checkpoint": getattr(r, "checkpoint", None)}  # "best", "latest"
    if "temperature" in reads:
      d["temperature"] = temperature(r, o.temperature)
    out.append(d)
  src = {"analysis": name, **out[0]}
  if "split" in reads:
    src["split"] = o.split  # None: the analysis' default split(s)
  for k in ("sentence", "pairs"):
    if k in reads:                # as JSON holds it (a tuple as a list)
      src[k] = json.loads(json.dumps(getattr(o, k)))
  if len(out) > 1:
    src["compare"] = out[1]
  return src


# What a result file is of, beyond the checkpoint's step (a newer best
# replaces an older one's results): a file of other values is not replaced.
# The inputs after the first three are compared only when the old file
# records them (files written before session 41 do not).
_SAME = ("workdir", "replica", "split", "checkpoint", "temperature",
         "sentence", "pairs")
_COMPARED = ("workdir", "replica", "checkpoint", "temperature")


def _identity(src: dict, recorded: dict | None = None) -> dict:
  """The inputs of `src` that name what its results are of; with
  `recorded` (an older file's source), only those it records too."""
  other = src.get("compare") or {}
  keys = [k for k in _SAME if recorded is None or k in _SAME[:3]
          or k in recorded]
  ckeys = [k for k in _COMPARED if recorded is None or k in ("workdir",
           "replica") or k in (recorded.get("compare") or {})]
  return {**{k: src.get(k) for k in keys},
          **{f"compare {k}": other.get(k) for k in ckeys}}


def _check_not_replacing(sources: dict, out) -> None:
  """An analysis whose JSON in `out` holds results of another run,
  replica, split or compared run than its `sources` entry: an
  AnalysisError before any analysis runs (those results would be lost)."""
  for a, src in sources.items():
    path = os.path.join(out, f"{a}.json")
    if not os.path.isfile(path):
      continue
    try:
      with open(path, encoding="utf-8") as f:
        old = json.load(f).get("source") or {}
    except (OSError, ValueError, AttributeError):
      continue  # not one of ours, or damaged: nothing to keep
    was, now = _identity(old, old), _identity(src, old)
    differ = [f"{k} {was[k]!r} -> {now[k]!r}" for k in now
              if was[k] != now[k]]
    if differ:
      raise AnalysisError(
          f"{path} holds {a} results of other inputs ({'; '.join(differ)}):"
          " give another --out to keep both, or delete it")


def analysis_names(analyses) -> list[str]:
  """The names in `analyses` (a list, or one comma-separated string),
  each one of ANALYSES; an AnalysisError naming the unknown ones or
  saying none was given."""
  analyses = [a.strip() for a in (analyses.split(",") if isinstance(
      analyses, str) else analyses) if a.strip()]
  unknown = [a for a in analyses if a not in ANALYSES]
  if unknown or not analyses:
    raise AnalysisError(
        (f"unknown analyses {unknown}" if unknown else "analyses: none "
         "given") + f"; known: {', '.join(ANALYSES)}")
  return analyses


def run_analyses(run, analyses, out: str | None = None,
                 options: Options | None = None, given=None, **kwargs
                 ) -> dict[str, list[str]]:
  """Runs the named analyses on `run`; returns the files each wrote (in
  `out`, default RUN/analysis). Options come as an `Options` or keywords;
  `given`: the options (flag names) the caller set, default those not at
  their defaults — each must be read by one of the analyses. Every
  analysis is checked before any writes a file."""
  analyses = analysis_names(analyses)
  o = options or Options(**kwargs)
  prepared = check(run, analyses, o, given)
  out = output_dir(run, out)
  sources = {a: _source(a, run, o) for a in analyses}
  _check_not_replacing(sources, out)
  return {a: ANALYSES[a].fn(run, out, o, sources[a], prepared[a])
          for a in analyses}


__all__ = ["ANALYSES", "Options", "Spec", "check", "describe", "names",
           "run_analyses"]
