"""Targeted syntactic evaluation with minimal pairs (Lin et al. sec. 5,
after Marvin & Linzen 2018; BLiMP, Warstadt et al. 2020).

    pairs = read_pairs("pairs.jsonl")          # or a directory, or .jsonl.gz
    pairs = blimp_pairs()                      # BLiMP via its TFDS builder
    evaluate(run, pairs)                       # accuracy per category
    compare([run_a, run_b], pairs)             # side by side (Table 3)
    sentence_log_probs(run, "The authors that no security guards like ...")

A pair is (sentence_good, sentence_bad, category); it is correct when the
LM gives the good sentence the higher total log-likelihood. A sentence is
scored as a line of the training stream: the context starts at `<eos>` and
every symbol of the sentence is scored (the final `<eos>` too with
score_eos=True).

Text -> symbols of the run's corpus:
* word corpora (ptb, wikitext2): PTB-style word tokens (clitics "n't",
  "'s" split off, punctuation split off); lower-cased when the vocabulary
  is (fewer than 1% of its symbols have an upper-case letter, e.g. PTB);
  punctuation kept when the vocabulary has ".", else dropped (PTB has
  none). A vocabulary in WikiText's forms gets them: "didn 't" (not
  "did n't") when it has "'t" but no "n't", and a hyphen inside a word
  it lacks as "@-@" ("well @-@ known") when it has "@-@". Words not in
  the vocabulary map to `<unk>`; they and the dropped punctuation are
  counted in the result.
* character corpora: ptb_char joins words with "_", ptb_char_maupome
  applies its letters-only rule (ptb_char_maupome_bigram then cuts each
  word in bigrams, as its corpus: "state" -> st, at, e; an unseen bigram
  maps to `<unk>`), tinyshakespeare keeps the text; a character the
  vocabulary lacks is an error (no `<unk>`).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import zlib
from typing import Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sorjax.analysis.common import (OnProgress, fail, figure,
                                    progress_part, require_task, save,
                                    temperature)
from sorjax.data import tokenize

_WORD = re.compile(r"\w+(?=n't)|n't|'\w+|\w+(?:[-.]\w+)*|[^\w\s]")
_PUNCT = re.compile(r"[^\w\s]+")
CHAR_CORPORA = ("ptb_char", "ptb_char_maupome", "ptb_char_maupome_bigram",
                "tinyshakespeare")


class Pair(NamedTuple):
  good: str
  bad: str
  category: str
  where: str | None = None    # "file:line" of a pair read from JSONL


# ---------------------------------------------------------------- reading

def _files(path: str) -> list[str]:
  if os.path.isdir(path):
    found = sorted(glob.glob(os.path.join(path, "*.jsonl")) +
                   glob.glob(os.path.join(path, "*.jsonl.gz")))
    if not found:
      raise FileNotFoundError(f"read_pairs: no *.jsonl or *.jsonl.gz files "
                              f"in {path}")
    return found
  if not os.path.isfile(path):
    raise FileNotFoundError(f"read_pairs: no such file {path}")
  return [path]


def read_pairs(paths: str | Iterable[str], category_field: str | None = "UID",
               require_category: bool = False) -> list[Pair]:
  """Pairs from JSONL files (.jsonl or .jsonl.gz, or directories of them):
  one object per line with string fields sentence_good and sentence_bad,
  and optionally `category_field` (BLiMP's "UID"); lines without it fall
  in the category named after their file. require_category: an error when
  no line has `category_field` (a misspelt field)."""
  if isinstance(paths, str):
    paths = [paths]
  out, fields = [], set()
  for path in paths:
    for f in _files(path):
      out += _read_file(f, category_field, fields)
  if not out:
    raise ValueError(f"read_pairs: no pairs in {list(paths)}")
  if require_category and category_field not in fields:
    raise ValueError(f"read_pairs: no line of {list(paths)} has the "
                     f"category field {category_field!r}; their fields are "
                     f"{sorted(fields)}")
  return out


def _read_file(f: str, category_field, fields: set) -> list[Pair]:
  """The pairs of one file (adding its lines' fields to `fields`); a
  ValueError naming the file (and line) for bytes that are not UTF-8 or
  gzip."""
  stem = os.path.basename(f).removesuffix(".gz").removesuffix(".jsonl")
  opener = gzip.open if f.endswith(".gz") else open
  out = []
  try:
    with opener(f, "rb") as lines:
      for i, raw in enumerate(lines, 1):
        line = _decode(raw, f"{f}:{i}")
        if line.strip():
          out.append(_pair(line, f"{f}:{i}", category_field, stem, fields))
  except (OSError, EOFError, zlib.error) as e:
    if not f.endswith(".gz"):
      raise
    raise ValueError(f"{f}: not a readable gzip file ({e})") from None
  return out


def _decode(raw: bytes, where: str) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{where}: not UTF-8 text ({e.reason}: byte "
                     f"{raw[e.start:e.start + 1]!r} at column "
                     f"{e.start + 1})") from None


def _pair(line: str, where: str, category_field, default: str,
          fields: set) -> Pair:
  try:
    rec = json.loads(line)
  except json.JSONDecodeError as e:
    raise ValueError(f"{where}: not a JSON line ({e})") from None
  if not isinstance(rec, dict):
    raise ValueError(f"{where}: expected a JSON object, got "
                     f"{type(rec).__name__}")
  for k in ("sentence_good", "sentence_bad"):
    if not isinstance(rec.get(k), str) or not rec[k].strip():
      raise ValueError(f"{where}: field {k!r} must be a non-empty string, "
                       f"got {rec.get(k)!r}")
  fields.update(rec)
  cat = rec.get(category_field) if category_field else None
  return Pair(rec["sentence_good"], rec["sentence_bad"],
              default if cat is None else str(cat), where)


def blimp_pairs(phenomena: Iterable[str] | None = None, data_dir=None,
                manual_dir=None, category: str = "UID",
                verify_checksums: bool = True) -> list[Pair]:
  """BLiMP's pairs from its TFDS builder (`datasets/blimp`, built from the
  local copy on first use). category: "UID" (the 67 phenomena), or the
  phenomenon's "field" or "linguistics_term"."""
  from sorjax.data import builders
  b = builders.prepare("blimp", data_dir, manual_dir,
                       verify_checksums=verify_checksums)
  meta = b.info.metadata["phenomena"]
  if category != "UID" and category not in next(iter(meta.values())):
    raise ValueError(f"blimp_pairs: category must be 'UID' or a phenomenon "
                     f"field {sorted(next(iter(meta.values())))}, got "
                     f"{category!r}")
  wanted = None if phenomena is None else set(phenomena)
  if wanted is not None and wanted - set(meta):
    raise ValueError(f"blimp_pairs: unknown phenomena "
                     f"{sorted(wanted - set(meta))}")
  source = b.as_data_source(split="test")
  records = source.__getitems__(range(len(source)))
  out = []
  for r in records:
    r = {k: v.decode() if isinstance(v, bytes) else v for k, v in r.items()}
    if wanted is None or r["UID"] in wanted:
      cat = r["UID"] if category == "UID" else meta[r["UID"]][category]
      out.append(Pair(r["sentence_good"], r["sentence_bad"], str(cat)))
  return out


# ---------------------------------------------------------------- encoding

class Encoded(NamedTuple):
  symbols: list[str]      # the symbols scored (after <unk> mapping)
  words: list[str]        # the text's tokens, aligned with symbols
  ids: np.ndarray         # int32 ids of symbols
  oov: list[str]          # tokens mapped to <unk>
  dropped: list[str]      # punctuation the vocabulary has no symbol for


def _corpus(run) -> str:
  return str(run.config.data.corpus).partition("/")[0]


def normalisation(run, lowercase: bool | None = None,
                  punctuation: str | None = None) -> dict:
  """The text normalisation for the run's vocabulary (auto when None)."""
  vocab = run.task.vocab
  if lowercase is None:
    upper = sum(any(ch.isupper() for ch in s) for s in vocab.symbols)
    lowercase = upper < 0.01 * len(vocab)
  if punctuation is None:
    punctuation = "keep" if "." in vocab else "drop"
  if punctuation not in ("keep", "drop"):
    raise ValueError(f"punctuation must be 'keep' or 'drop', got "
                     f"{punctuation!r}")
  return {"lowercase": bool(lowercase), "punctuation": punctuation}


def encode_sentence(run, text: str, norm: dict | None = None) -> Encoded:
  """The run's symbols and ids of one sentence (see the module doc)."""
  norm = norm or normalisation(run)
  vocab, corpus = run.task.vocab, _corpus(run)
  if norm["lowercase"]:
    text = text.lower()
  dropped = []
  if corpus in CHAR_CORPORA:
    if corpus == "ptb_char":
      words = list("_".join(text.split()))
    elif corpus == "ptb_char_maupome":
      words = list(tokenize.letters_only(text))
    elif corpus == "ptb_char_maupome_bigram":
      words = tokenize.Tokenizer("char_bigram", eos=None)(
          tokenize.letters_only(text))
    else:
      words = list(" ".join(text.split()))
    missing = [ch for ch in words if ch not in vocab]
    if missing and vocab.unk is None:
      raise ValueError(f"sentence {text!r}: character {missing[0]!r} is not "
                       f"in the {corpus} vocabulary, which has no <unk>")
  else:
    words = []
    for w in _WORD.findall(text):
      if _PUNCT.fullmatch(w) and norm["punctuation"] == "drop" and (
          w not in vocab):
        dropped.append(w)
      else:
        words.append(w)
    words = _wikitext_forms(words, vocab)
  oov = [w for w in words if w not in vocab]
  symbols = [w if w in vocab else vocab.unk for w in words]
  if not symbols:
    raise ValueError(f"sentence {text!r} has no symbols to score")
  return Encoded(symbols, words, vocab.encode(symbols), oov, dropped)


def _wikitext_forms(words: list[str], vocab) -> list[str]:
  """PTB-style tokens in WikiText's forms when the vocabulary has them:
  "did n't" -> "didn 't" (WikiText has "'t" and no "n't"), and a hyphen
  inside a word the vocabulary lacks -> "@-@" ("well @-@ known")."""
  if "n't" not in vocab and "'t" in vocab:
    out = []
    for w in words:
      if w == "n't" and out and out[-1][-1:].isalnum():
        out[-1] += "n"
        w = "'t"
      out.append(w)
    words = out
  if "@-@" in vocab:
    out = []
    for w in words:
      parts = w.split("-")
      if len(parts) > 1 and all(parts) and w not in vocab:
        for i, part in enumerate(parts):
          out += ["@-@", part] if i else [part]
      else:
        out.append(w)
    words = out
  return words


# ---------------------------------------------------------------- scoring

def _with_context(run, ids, score_eos):
  eos = run.task.vocab.eos_id
  if eos is None:
    raise ValueError("minimal pairs: the vocabulary has no <eos> to start a "
                     "sentence from")
  return np.concatenate([[eos], ids] + ([[eos]] if score_eos else [])
                        ).astype(np.int32)


def _log_prob_fn(run, tau=None):
  """tokens [B, T], lengths [B] -> log-probabilities [B, T, V] under the
  run at temperature `tau` (default the run's): `Run.log_probs`, jitted
  (it runs eagerly: too slow for BLiMP's 134k sentences). A stand-in run
  without `task.apply` uses its own. The params are an argument of the
  jitted function: closed over, jit would bake them into each length's
  executable as constants (a copy of the weights per compiled shape, in
  device memory on a GPU / TPU)."""
  task = run.task
  if not hasattr(task, "apply"):
    return lambda tokens, lengths: run.log_probs(tokens, lengths,
                                                 temperature=tau)
  params, tau = run.params, temperature(run, tau)

  @jax.jit
  def log_probs(params, tokens, lengths):
    logits, _ = task.apply(params, tokens, lengths, temperature=tau)
    return jax.nn.log_softmax(logits.astype(jnp.float32), -1)

  return lambda tokens, lengths: np.asarray(log_probs(params, tokens,
                                                      lengths))


def token_log_probs(run, seqs: list[np.ndarray], batch_size: int = 64,
                    multiple: int = 8, tau: float | None = None,
                    progress: OnProgress | None = None
                    ) -> list[np.ndarray]:
  """log p(seq[t] | seq[:t]) for t >= 1 of each int sequence, in batches
  of `batch_size` rows (the last padded) sorted by length, T padded to a
  multiple of `multiple`: few shapes, so few compilations. `progress(done,
  total)` is called with the sequences scored after each batch."""
  log_probs = _log_prob_fn(run, tau)
  order = np.argsort([len(s) for s in seqs], kind="stable")
  out = [None] * len(seqs)
  rows = min(batch_size, len(seqs))
  for start in range(0, len(seqs), rows):
    idx = order[start:start + rows]
    T = max(len(seqs[i]) for i in idx)
    T = -(-T // multiple) * multiple
    tokens = np.zeros((rows, T), np.int32)
    lengths = np.ones(rows, np.int32)       # padding rows: one token
    for r, i in enumerate(idx):
      tokens[r, :len(seqs[i])] = seqs[i]
      lengths[r] = len(seqs[i])
    lp = log_probs(tokens, lengths)
    nxt = np.take_along_axis(lp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    for r, i in enumerate(idx):
      out[i] = nxt[r, :lengths[r] - 1].astype(np.float64)
    if progress is not None:
      progress(start + len(idx), len(seqs))
  return out


def encode_pairs(run, pairs: list[Pair], norm: dict, score_eos: bool
                 = False) -> tuple[list[np.ndarray], list[Encoded]]:
  """(id sequences with their context, Encoded) of every pair's good and
  bad sentence; an error naming the pair's file:line when one cannot be
  encoded (a character the vocabulary lacks)."""
  seqs, encs = [], []
  for p in pairs:
    for text in (p.good, p.bad):
      try:
        enc = encode_sentence(run, text, norm)
      except ValueError as e:
        raise ValueError(f"{p.where}: {e}" if p.where else str(e)) from None
      encs.append(enc)
      seqs.append(_with_context(run, enc.ids, score_eos))
  return seqs, encs


def evaluate(run, pairs: list[Pair], score_eos: bool = False,
             lowercase: bool | None = None, punctuation: str | None = None,
             batch_size: int = 64, tau: float | None = None,
             progress: OnProgress | None = None) -> dict:
  """Accuracy per category (and overall) of log p(good) > log p(bad),
  with the out-of-vocabulary and dropped-punctuation counts; `progress`
  as in `token_log_probs` (two sentences a pair).

  `identical` counts the pairs whose two sentences become the same
  symbols (they differ only in words mapped to `<unk>` or in dropped
  punctuation): the LM cannot tell them apart, they tie, and the strict
  comparison counts them incorrect. `accuracy_distinguishable` leaves
  them out (None when no pair is left)."""
  name = "minimal_pairs"
  require_task(name, run, ("lm",))
  if not pairs:
    raise fail(name, run, "no pairs to evaluate")
  norm = normalisation(run, lowercase, punctuation)
  seqs, encs = encode_pairs(run, pairs, norm, score_eos)
  oov = collections.Counter(w for e in encs for w in e.oov)
  dropped = collections.Counter(w for e in encs for w in e.dropped)
  sent_oov = [bool(e.oov) for e in encs]
  lps = token_log_probs(run, seqs, batch_size, tau=tau, progress=progress)
  total = np.array([lp.sum() for lp in lps]).reshape(-1, 2)
  correct = total[:, 0] > total[:, 1]
  same = np.array([np.array_equal(encs[2 * i].ids, encs[2 * i + 1].ids)
                   for i in range(len(pairs))])
  cats = collections.defaultdict(list)
  for i, p in enumerate(pairs):
    cats[p.category].append(i)
  has_oov = np.array(sent_oov).reshape(-1, 2).any(1)
  return {
      "pairs": len(pairs), "accuracy": float(correct.mean()),
      "identical": int(same.sum()),
      "accuracy_distinguishable": (float(correct[~same].mean())
                                   if not same.all() else None),
      "categories": {c: {"pairs": len(ix), "correct": int(correct[ix].sum()),
                         "accuracy": float(correct[ix].mean()),
                         "identical": int(same[ix].sum())}
                     for c, ix in sorted(cats.items())},
      "normalisation": norm, "score_eos": score_eos,
      "oov": {"tokens": int(sum(oov.values())), "types": len(oov),
              "sentences": int(sum(sent_oov)),
              "pairs": int(has_oov.sum()),
              "most_common": oov.most_common(50)},
      "dropped_punctuation": dict(dropped),
      "scores": total}


def compare(runs, pairs: list[Pair], progress: OnProgress | None = None,
            **kwargs) -> dict:
  """`evaluate` of each run on the same pairs, side by side; `progress`
  counts the sentences of all the runs."""
  return {"runs": [r.workdir for r in runs],
          "results": [evaluate(r, pairs, **kwargs, progress=progress_part(
              progress, i, len(runs))) for i, r in enumerate(runs)]}


def sentence_log_probs(run, text: str, score_eos: bool = False,
                       lowercase: bool | None = None,
                       punctuation: str | None = None,
                       tau: float | None = None) -> dict:
  """Per-symbol log-probabilities of one sentence (Lin et al. sec. 5)."""
  require_task("token_losses", run, ("lm",))
  enc = encode_sentence(run, text, normalisation(run, lowercase,
                                                 punctuation))
  lp = token_log_probs(run, [_with_context(run, enc.ids, score_eos)],
                       tau=tau)[0]
  symbols = enc.symbols + ([run.task.vocab.eos] if score_eos else [])
  words = enc.words + ([run.task.vocab.eos] if score_eos else [])
  return {"sentence": text, "words": words, "symbols": symbols,
          "log_probs": lp, "total": float(lp.sum()), "oov": enc.oov,
          "dropped_punctuation": enc.dropped}


# ---------------------------------------------------------------- figures

def plot_categories(results: list[dict], labels: list[str], path: str
                    ) -> str:
  """Accuracy per category, one bar per run (Lin et al. Table 3)."""
  cats = sorted(set().union(*(r["categories"] for r in results)))
  fig, axes = figure(1, 1, size=(7, 0.28 * len(cats) * len(results) + 1.5))
  ax = axes[0, 0]
  y = np.arange(len(cats))
  h = 0.8 / len(results)
  for i, (r, label) in enumerate(zip(results, labels)):
    acc = [r["categories"].get(c, {}).get("accuracy", np.nan) for c in cats]
    ax.barh(y + (i - (len(results) - 1) / 2) * h, acc, h,
            label=f"{label} (all {r['accuracy']:.2f})")
  ax.set_yticks(y, cats, fontsize=7)
  ax.invert_yaxis()
  ax.axvline(0.5, color="gray", lw=0.8)
  ax.set_xlim(0, 1)
  ax.set_xlabel("accuracy: log p(good) > log p(bad)")
  ax.legend(fontsize=7)
  return save(fig, path)


def plot_sentence(results: list[dict], labels: list[str], path: str) -> str:
  """Per-symbol log-probabilities of one sentence for each run."""
  words = results[0]["words"]
  fig, axes = figure(1, 1, size=(min(24, max(6, 0.45 * len(words))), 3.5))
  ax = axes[0, 0]
  x = np.arange(len(words))
  bw = 0.8 / len(results)
  for i, (r, label) in enumerate(zip(results, labels)):
    ax.bar(x + (i - (len(results) - 1) / 2) * bw, r["log_probs"], bw,
           label=f"{label} (total {r['total']:.2f})")
  ax.set_xticks(x, [w if w == s else f"{w}\n({s})" for w, s in
                    zip(words, results[0]["symbols"])], fontsize=8,
                rotation=45, ha="right")
  ax.set_ylabel("log p(symbol | prefix)")
  ax.legend(fontsize=7)
  return save(fig, path)


__all__ = ["Encoded", "Pair", "blimp_pairs", "compare", "encode_pairs",
           "encode_sentence",
           "evaluate", "normalisation", "plot_categories", "plot_sentence",
           "read_pairs", "sentence_log_probs", "token_log_probs"]
