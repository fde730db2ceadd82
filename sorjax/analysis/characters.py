"""Character-level LM analyses of Maupome & Meurs (sec. 5, Fig. 2-3).

    position_losses(run)      mean test loss of a character as a function
                              of its position in its word (Fig. 3)
    prediction_examples(run)  lines of a split with the model's most likely
                              next character under each (Fig. 2)

A word is a maximal run of symbols between boundaries: the space symbol
(" ", or "_" in the PTB character files) and the end of line `<eos>`.
Position 1 is a word's first character; boundaries themselves are position
0 and are reported apart ("boundary"). Losses are the task's streamed
per-token NLLs (`perplexity.token_nll`), in nats and bits.

Prediction examples read each line from a fresh state after `<eos>`: the
symbol under character t is argmax_v p(v | <eos>, c_1 .. c_{t-1}).
"""

from __future__ import annotations

import math

import numpy as np

from sorjax import checks
from sorjax.analysis.common import (check_split, fail, figure, require_task,
                                    save, temperature)
from sorjax.analysis.perplexity import token_nll

CHAR_CORPORA = ("ptb_char", "ptb_char_maupome", "tinyshakespeare")
SPACES = (" ", "_")


def require_chars(name, run):
  require_task(name, run, ("lm",))
  corpus = str(run.config.data.corpus).partition("/")[0]
  if corpus not in CHAR_CORPORA:
    kind = ("of character bigrams" if corpus.endswith("_bigram") else
            "word-level")
    raise fail(name, run, f"needs a character LM ({', '.join(CHAR_CORPORA)}); "
               f"this run's corpus {corpus!r} is {kind}")


def word_positions(symbols, eos: str | None = "<eos>") -> np.ndarray:
  """Position in word of each symbol (1 = first character), 0 for the
  boundaries (spaces and eos); the stream starts at a boundary."""
  out = np.zeros(len(symbols), np.int64)
  k = 0
  for i, s in enumerate(symbols):
    if s in SPACES or s == eos:
      k = 0
    else:
      k += 1
      out[i] = k
  return out


def position_losses(run, split: str | None = None, max_position: int = 20,
                    tau: float | None = None) -> dict:
  """Mean NLL per position in word, positions 1..max_position (longer
  positions are pooled into max_position: "max_position or later")."""
  name = "word_position"
  require_chars(name, run)
  split = check_split(name, run, split)
  checks.check_int(f"{name}: max_position", max_position, 1)
  vocab = run.task.vocab
  pos = word_positions(vocab.decode(run.task.split_ids[split]), vocab.eos)
  _, nll, index = token_nll(run, split, tau)
  p = np.minimum(pos[index], max_position)
  sums = np.bincount(p, nll, minlength=max_position + 1)
  counts = np.bincount(p, minlength=max_position + 1)
  with np.errstate(invalid="ignore", divide="ignore"):
    mean = sums / counts
  return {"split": split, "max_position": max_position,
          "positions": list(range(1, max_position + 1)),
          "loss": mean[1:], "bits": mean[1:] / math.log(2),
          "count": counts[1:],
          "boundary": {"loss": mean[0], "count": int(counts[0])},
          "overall": {"loss": float(nll.mean()),
                      "bits": float(nll.mean() / math.log(2)),
                      "count": int(nll.size)}}


def plot_positions(result: dict, path: str) -> str:
  fig, axes = figure()
  ax = axes[0, 0]
  x = np.asarray(result["positions"])
  bits = np.array([np.nan if b is None else b for b in result["bits"]],
                  np.float64)
  ax.plot(x, bits, marker="o")
  ax.set_xlabel("character position in word"
                f" (last: {result['max_position']} or later)")
  ax.set_ylabel(f"mean {result['split']} loss (bits)")
  ax.set_title(f"overall {result['overall']['bits']:.3f} bits/char (every "
               "symbol); the curve leaves out boundaries", fontsize=10)
  return save(fig, path)


def _display(symbol: str) -> str:
  return " " if symbol in SPACES else symbol


def example_lines(run, split: str | None = None, num: int = 3,
                  min_length: int = 20, max_length: int = 80
                  ) -> list[tuple[int, int, bool]]:
  """(start, end, cut) in the split's ids of the lines `prediction_examples`
  shows: the first `num` lines of min_length..max_length characters, else
  the first `num` longer ones cut to their first max_length characters (a
  prefix's predictions are the whole line's: the model reads left to
  right). An AnalysisError when no line has min_length characters."""
  name = "prediction_examples"
  require_chars(name, run)
  split = check_split(name, run, split)
  ids = run.task.split_ids[split]
  ends = np.flatnonzero(ids == run.task.vocab.eos_id)
  starts = np.concatenate([[0], ends[:-1] + 1])
  lengths = ends - starts
  fit = np.flatnonzero((lengths >= min_length) & (lengths <= max_length))
  if fit.size:
    return [(int(starts[i]), int(ends[i]), False) for i in fit[:num]]
  long = np.flatnonzero(lengths > max_length)[:num]
  if not long.size:
    longest = int(lengths.max(initial=0))
    raise fail(name, run, f"no line of at least {min_length} characters in "
               f"split {split!r} (the longest has {longest})")
  return [(int(starts[i]), int(starts[i]) + max_length, True) for i in long]


def prediction_examples(run, split: str | None = None, num: int = 3,
                        min_length: int = 20, max_length: int = 80,
                        tau: float | None = None) -> dict:
  """The first `num` lines of a split with min_length..max_length
  characters (or, without any, the first longer ones cut to max_length:
  `example_lines`), and the model's argmax prediction of each
  character."""
  split = check_split("prediction_examples", run, split)
  vocab = run.task.vocab
  ids = run.task.split_ids[split]
  out = []
  for s, e, cut in example_lines(run, split, num, min_length, max_length):
    line = ids[s:e]
    tokens = np.concatenate([[vocab.eos_id], line]).astype(np.int32)
    lp = run.log_probs(tokens, temperature=tau)[:-1]   # None: the run's
    pred = lp.argmax(-1)
    nll = -lp[np.arange(line.size), line]
    out.append({"text": "".join(_display(c) for c in vocab.decode(line)),
                "predicted": "".join(_display(c)
                                     for c in vocab.decode(pred)),
                "correct": float(np.mean(pred == line)),
                "bits": float(nll.mean() / math.log(2)), "cut": cut})
  return {"split": split, "examples": out}


def plot_examples(result: dict, path: str) -> str:
  """Each true line above the model's predictions (Maupome & Meurs Fig.
  2); wrong predictions in red, a predicted space as a grey dot."""
  ex = result["examples"]
  width = max(len(e["text"]) for e in ex) + 6
  fig, axes = figure(1, 1, size=(0.1 * width + 0.4, 0.5 * len(ex) + 0.3))
  ax = axes[0, 0]
  ax.set_xlim(0, width)
  ax.set_ylim(3 * len(ex) - 1, -1)
  ax.axis("off")
  font = dict(family="monospace", fontsize=10, va="center", ha="left")
  for k, e in enumerate(ex):
    ax.text(0, 3 * k, "true", color="gray", **font)
    ax.text(0, 3 * k + 1, "pred", color="gray", **font)
    for i, (t, p) in enumerate(zip(e["text"], e["predicted"])):
      ax.text(6 + i, 3 * k, t, **font)
      ax.text(6 + i, 3 * k + 1, "\u00b7" if p == " " else p, **font,
              color="tab:red" if t != p else "gray" if p == " " else "black")
  return save(fig, path)


__all__ = ["plot_examples", "plot_positions", "position_losses",
           "prediction_examples", "require_chars", "word_positions"]
