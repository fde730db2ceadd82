"""Analyses of a trained run, from its work directory alone.

    python -m experiments.analyze --workdir=RUN --analyses=perplexity,ldpa
    python -m experiments.analyze --workdir=MTS --compare=BASELINE \\
        --analyses=frequency --labels=mts,baseline
    python -m experiments.analyze --workdir=LM --analyses=minimal_pairs \\
        --pairs=blimp

JSON results and PNG (and HTML) figures go to RUN/analysis/ for the best
checkpoint of replica 0, else to a folder in it named for --step and
--replica (RUN/analysis/latest-replica_1), or to --out; a result file of
other inputs (run, replica, split, compared run) is not replaced.
Analyses: see `sorjax.analysis.runner.ANALYSES` (--analyses=help lists
them).
"""

from __future__ import annotations

import logging as std_logging
import os
import sys

import jax
from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "The run's work directory.")
flags.DEFINE_list("analyses", None, "Comma-separated analyses to run "
                  "('help' lists them).")
flags.DEFINE_string("step", "best", "Checkpoint: best, latest or a step.")
flags.DEFINE_integer("replica", 0, "Which replica's params to analyse "
                     "(of --workdir's run).")
flags.DEFINE_string("compare", None, "A second run's work directory "
                    "(frequency, minimal_pairs, token_losses, perplexity).")
flags.DEFINE_string("compare_step", "best", "The second run's checkpoint.")
flags.DEFINE_integer("compare_replica", 0, "The second run's replica (the "
                     "same directory as --workdir with another replica "
                     "compares seeds).")
flags.DEFINE_list("labels", None, "Names of the run and the compared run "
                  "in figures (default: the directories' names).")
flags.DEFINE_string("split", None, "Split to analyse (default: the task's "
                    "test split; ldpa: dev and test; gradient_ratio: "
                    "train).")
flags.DEFINE_list("pairs", [], "minimal_pairs: JSONL files, directories of "
                  "*.jsonl[.gz], or 'blimp'.")
flags.DEFINE_string("category_field", "UID", "minimal_pairs: the JSONL "
                    "field naming a pair's category.")
flags.DEFINE_string("sentence", None, "token_losses: the sentence; "
                    "attention_heatmap: text to show instead of a split.")
flags.DEFINE_float("temperature", None, "The attention LSTM's softmax "
                   "temperature tau (default: the run's evaluation "
                   "temperature); refused for models without one.")
flags.DEFINE_integer("num_resamples", 10_000, "frequency: bootstrap "
                     "resamples.")
flags.DEFINE_integer("seed", 0, "frequency: bootstrap seed.")
flags.DEFINE_integer("max_tokens", None, "timescales, word_ablation: at most "
                     "this many tokens of an LM split.")
flags.DEFINE_integer("max_sequences", None, "timescales, word_ablation: at "
                     "most this many sequences of a Dyck split (lines of a "
                     "data.documents LM; for word_ablation also windows of "
                     "an LM stream, 256 by default).")
flags.DEFINE_integer("max_trees", 1000, "gradient_ratio: trees per epoch.")
flags.DEFINE_integer("position", 0, "word_ablation: the ablated position.")
flags.DEFINE_string("data_dir", None, "minimal_pairs with blimp: TFDS "
                    "data_dir.")
flags.DEFINE_string("out", None, "Output directory (default RUN/analysis, "
                    "or a folder in it named for another checkpoint or "
                    "replica: latest, step_300, replica_1, "
                    "latest-replica_1).")


# Flags read by some analyses only: one given to none of the chosen ones is
# an error (runner.run_analyses' `given`).
OPTION_FLAGS = ("compare", "compare_step", "compare_replica", "labels",
                "split", "pairs", "category_field", "sentence",
                "temperature", "num_resamples", "seed", "max_tokens",
                "max_sequences", "max_trees", "position", "data_dir")


def _step(value: str):
  return int(value) if value.lstrip("-").isdigit() else value


def _restore_compared(compare: str):
  """--compare's run at --compare_step, replica --compare_replica; its
  errors name those flags."""
  import sorjax
  from sorjax.analysis.common import AnalysisError
  try:
    return sorjax.restore(compare, _step(FLAGS.compare_step),
                          FLAGS.compare_replica)
  except (ValueError, OSError, KeyError) as e:
    raise AnalysisError(f"--compare={FLAGS.compare} "
                        f"(--compare_step={FLAGS.compare_step}, "
                        f"--compare_replica={FLAGS.compare_replica}): {e}"
                        ) from None


def _label(workdir: str, replica: int) -> str:
  """A run's default name in figures: its directory (and replica)."""
  name = os.path.basename(os.path.normpath(workdir))
  return f"{name} replica {replica}" if replica else name


def _given() -> list[str]:
  given = [f for f in OPTION_FLAGS if FLAGS[f].present]
  for flag in ("compare_step", "compare_replica"):
    if flag in given and not FLAGS.compare:
      raise app.UsageError(f"--{flag} needs --compare")
  return given


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from sorjax.analysis import runner
  if FLAGS.analyses == ["help"]:
    for name, spec in runner.ANALYSES.items():
      print(f"{name:18s} {spec.doc}")
    return
  if not FLAGS.workdir or not FLAGS.analyses:
    raise app.UsageError("--workdir and --analyses are required")
  given = _given()
  std_logging.getLogger("absl").setLevel(std_logging.WARNING)
  import sorjax
  from sorjax.analysis.common import AnalysisError
  # ~ as a shell expands it (it does not after --workdir=)
  workdir = os.path.expanduser(FLAGS.workdir)
  compare = FLAGS.compare and os.path.expanduser(FLAGS.compare)
  try:
    analyses = runner.analysis_names(FLAGS.analyses)  # before any restore
    run = sorjax.restore(workdir, _step(FLAGS.step), FLAGS.replica)
    other = _restore_compared(compare) if compare else None
    labels = tuple(FLAGS.labels or (
        _label(workdir, FLAGS.replica),
        _label(compare or "other", FLAGS.compare_replica)))
    if len(labels) != 2:
      raise AnalysisError(f"--labels needs two names, got {list(labels)}")
    options = runner.Options(
        split=FLAGS.split, compare=other, labels=labels,
        pairs=tuple(FLAGS.pairs), category_field=FLAGS.category_field,
        sentence=FLAGS.sentence, temperature=FLAGS.temperature,
        num_resamples=FLAGS.num_resamples, seed=FLAGS.seed,
        max_tokens=FLAGS.max_tokens, max_sequences=FLAGS.max_sequences,
        max_trees=FLAGS.max_trees, position=FLAGS.position,
        data_dir=FLAGS.data_dir, progress=True)
    written = runner.run_analyses(run, analyses, FLAGS.out, options, given)
  except (AnalysisError, ValueError, OSError, KeyError) as e:
    logging.error("analysis error: %s", e)
    sys.exit(f"analysis error: {e}")
  for name, paths in written.items():
    for p in paths:
      print(f"{name}: {p}")


if __name__ == "__main__":
  jax.config.config_with_absl()  # every JAX option as a --jax_* flag
  app.run(main)
