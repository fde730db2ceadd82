"""Named analyses of a restored run, writing JSON and figures.

    run = sorjax.restore("/tmp/run")
    run_analyses(run, ["perplexity", "ldpa"])   # -> RUN/analysis/*.json, *.png

`experiments/analyze.py` is the command line over this. Each analysis is
one function of `sorjax.analysis.*` (usable alone in a notebook) plus its
plot; see ANALYSES for the names and what they need.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from sorjax.analysis import (attention, characters, dyck, minimal_pairs,
                             perplexity, timescales, tree_gradients)
from sorjax.analysis.common import AnalysisError, output_dir, write_json
from sorjax.analysis.common import splits as task_splits


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


def _path(out, name):
  return os.path.join(out, name)


def _perplexity(run, out, o):
  res = {"run": perplexity.perplexity(run, o.split, o.temperature)}
  if o.compare is not None:
    res["other"] = perplexity.perplexity(o.compare, o.split)
  return [write_json(_path(out, "perplexity.json"), res)]


def _ldpa(run, out, o):
  splits = (o.split,) if o.split else tuple(
      s for s in ("dev", "test") if s in task_splits(run))
  res = dyck.ldpa(run, splits, o.temperature)
  return [write_json(_path(out, "ldpa.json"), res),
          dyck.plot_ldpa(res, _path(out, "ldpa.png"))]


def _pcfg(run, out, o):
  res = dyck.pcfg_timescales(run, o.split, tau=o.temperature)
  return [write_json(_path(out, "pcfg_timescales.json"), res),
          dyck.plot_pcfg_timescales(res, _path(out, "pcfg_timescales.png"))]


def _frequency(run, out, o):
  if o.compare is None:
    res = perplexity.frequency(run, o.split, o.temperature)
  else:
    res = perplexity.compare_frequency(
        run, o.compare, o.split, o.num_resamples, seed=o.seed,
        tau_a=o.temperature)
  return [write_json(_path(out, "frequency.json"), res),
          perplexity.plot_frequency(res, _path(out, "frequency.png"),
                                    o.labels)]


def _timescales(run, out, o):
  res = timescales.estimate(run, o.split, o.temperature, o.max_tokens,
                            o.max_sequences)
  return [write_json(_path(out, "timescales.json"), res),
          timescales.plot_scatter(res, _path(out, "timescales_scatter.png")),
          timescales.plot_ks(res, _path(out, "timescales_ks.png"))]


def _forget_heatmap(run, out, o):
  res = timescales.forget_heatmap(run, o.split, tau=o.temperature)
  return [write_json(_path(out, "forget_heatmap.json"), res),
          timescales.plot_forget_heatmap(res,
                                         _path(out, "forget_heatmap.png"))]


def _ablation(run, out, o):
  res = timescales.word_ablation(run, o.split, o.position,
                                 tau=o.temperature, max_tokens=o.max_tokens,
                                 max_sequences=o.max_sequences or 256)
  return [write_json(_path(out, "word_ablation.json"), res),
          timescales.plot_ablation(res, _path(out, "word_ablation.png"))]


def _angles(run, out, o):
  res = attention.principal_angles(run)
  return [write_json(_path(out, "principal_angles.json"), res),
          attention.plot_principal_angles(res,
                                          _path(out, "principal_angles.png"))]


def _heatmap(run, out, o):
  res = attention.attention_map(run, o.split, text=o.sentence,
                                tau=o.temperature)
  html_path = _path(out, "attention_heatmap.html")
  with open(html_path, "w", encoding="utf-8") as f:
    f.write(attention.heatmap_html(res))
  return [write_json(_path(out, "attention_heatmap.json"), res), html_path,
          attention.plot_heatmap(res, _path(out, "attention_heatmap.png"))]


def _gradient_ratio(run, out, o):
  res = tree_gradients.gradient_ratio(run, o.split, o.max_trees)
  return [write_json(_path(out, "gradient_ratio.json"), res),
          tree_gradients.plot_gradient_ratio(
              res, _path(out, "gradient_ratio.png"))]


def _pairs(o, run):
  if not o.pairs:
    raise AnalysisError("minimal_pairs: give --pairs (JSONL files or "
                        "directories of them, or 'blimp')")
  pairs = []
  for p in o.pairs:
    if p == "blimp":
      pairs += minimal_pairs.blimp_pairs(data_dir=o.data_dir)
    else:
      pairs += minimal_pairs.read_pairs(p, o.category_field)
  return pairs


def _minimal_pairs(run, out, o):
  runs = [run] + ([o.compare] if o.compare is not None else [])
  res = minimal_pairs.compare(runs, _pairs(o, run))
  return [write_json(_path(out, "minimal_pairs.json"), res),
          minimal_pairs.plot_categories(res["results"],
                                        list(o.labels[:len(runs)]),
                                        _path(out, "minimal_pairs.png"))]


def _token_losses(run, out, o):
  if not o.sentence:
    raise AnalysisError("token_losses: give --sentence")
  runs = [run] + ([o.compare] if o.compare is not None else [])
  res = [minimal_pairs.sentence_log_probs(r, o.sentence) for r in runs]
  return [write_json(_path(out, "token_losses.json"),
                     {"runs": [r.workdir for r in runs], "results": res}),
          minimal_pairs.plot_sentence(res, list(o.labels[:len(runs)]),
                                      _path(out, "token_losses.png"))]


def _word_position(run, out, o):
  res = characters.position_losses(run, o.split, tau=o.temperature)
  ex = characters.prediction_examples(run, o.split, tau=o.temperature)
  with open(_path(out, "prediction_examples.txt"), "w",
            encoding="utf-8") as f:
    for e in ex["examples"]:
      f.write(f"{e['text']}\n{e['predicted']}\n\n")
  return [write_json(_path(out, "word_position.json"), res),
          characters.plot_positions(res, _path(out, "word_position.png")),
          write_json(_path(out, "prediction_examples.json"), ex),
          _path(out, "prediction_examples.txt"),
          characters.plot_examples(ex, _path(out,
                                             "prediction_examples.png"))]


ANALYSES: dict[str, tuple[Callable, str]] = {
    "perplexity": (_perplexity, "cross-entropy, perplexity, bits; oracle "
                   "ratio (lm, dyck_lm)"),
    "ldpa": (_ldpa, "LDPA per closing distance, WCPA (dyck_lm, "
             "dyck_closing; Lin Fig. 2)"),
    "pcfg_timescales": (_pcfg, "accuracy vs maximum timescale (dyck_pcfg; "
                        "Mahto Fig. 2)"),
    "frequency": (_frequency, "perplexity by training frequency; with "
                  "--compare the bootstrap CI (lm; Mahto Table 1)"),
    "timescales": (_timescales, "T_est per unit, scatter and KS fits "
                   "(lstm/mts_lstm layers; Mahto eq. 3, Fig. 1, 4)"),
    "forget_heatmap": (_forget_heatmap, "sorted forget gates of one "
                       "sequence (Mahto Fig. 5)"),
    "word_ablation": (_ablation, "cell-state decay after a word ablation "
                      "(Mahto Fig. 6-8)"),
    "principal_angles": (_angles, "PABS of the S W_hh matrices "
                         "(attention/assignment LSTM; Lin Fig. 4-5)"),
    "attention_heatmap": (_heatmap, "tokens coloured by argmax cell "
                          "(attention LSTM; Lin Fig. 6), HTML and PNG"),
    "gradient_ratio": (_gradient_ratio, "||dJ/dx_keyword|| / ||dJ/dx_root|| "
                       "per depth and epoch (keyword trees; Le & Zuidema "
                       "3.3)"),
    "minimal_pairs": (_minimal_pairs, "accuracy per category on minimal "
                      "pairs, --pairs (lm; Lin Table 3, BLiMP)"),
    "token_losses": (_token_losses, "per-token log-probabilities of "
                     "--sentence (lm; Lin sec. 5)"),
    "word_position": (_word_position, "loss by position in word and "
                      "prediction examples (char LMs; Maupome Fig. 2-3)"),
}


def names() -> list[str]:
  return list(ANALYSES)


def run_analyses(run, analyses, out: str | None = None,
                 options: Options | None = None, **kwargs
                 ) -> dict[str, list[str]]:
  """Runs the named analyses on `run`; returns the files each wrote (in
  `out`, default RUN/analysis). Options come as an `Options` or keywords."""
  analyses = [a.strip() for a in (analyses.split(",") if isinstance(
      analyses, str) else analyses) if a.strip()]
  unknown = [a for a in analyses if a not in ANALYSES]
  if unknown or not analyses:
    raise AnalysisError(f"unknown analyses {unknown}; known: "
                        f"{', '.join(ANALYSES)}" if unknown else
                        "no analysis named")
  o = options or Options(**kwargs)
  out = output_dir(run, out)
  return {a: ANALYSES[a][0](run, out, o) for a in analyses}


__all__ = ["ANALYSES", "Options", "names", "run_analyses"]
