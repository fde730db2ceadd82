"""TFDS builders of the synthetic languages (datasets/dyck_km, dyck_pcfg,
keyword_trees): built at a tiny scale into a temp dir without TensorFlow,
read back with as_data_source, equal to the generators' output for the same
seed, and checked against naive references (stack loops, tree parsing)."""

import dataclasses
import sys

import numpy as np
import pytest

from sorjax.data import (builders, build, corpora, dyck, keyword_trees,
                         markov, pcfg)


def tiny(builder_name, **fields):
  """Builder `name` with a copy of its first config at a tiny scale."""
  cls = builders.builder_class(builder_name)
  config = dataclasses.replace(cls.BUILDER_CONFIGS[0], **fields)
  return cls, config


def build_tiny(builder_name, data_dir, **fields):
  cls, config = tiny(builder_name, **fields)
  b = cls(config=config, data_dir=str(data_dir), file_format="array_record")
  b.download_and_prepare()
  assert "tensorflow" not in sys.modules
  return b, b.as_data_source()


def naive_distances(seq, k):
  """Closing position minus opening position, by a stack (0 elsewhere)."""
  stack, out = [], [0] * len(seq)
  for t, s in enumerate(seq):
    if s < k:
      stack.append(t)
    elif s < 2 * k:
      out[t] = t - stack.pop()
  return out


def naive_leaves_and_depths(text):
  """Leaf tokens and their depths from a bracketed tree string."""
  leaves, depths, depth = [], [], 0
  for tok in text.replace("(", " ( ").replace(")", " ) ").split():
    if tok == "(":
      depth += 1
    elif tok == ")":
      depth -= 1
    else:
      leaves.append(int(tok))
      depths.append(depth)
  return leaves, depths


def test_configs_published_with_fixed_seeds():
  names = {n: [c.name for c in builders.builder_class(n).BUILDER_CONFIGS]
           for n in ("dyck_km", "dyck_pcfg", "keyword_trees")}
  assert names["dyck_km"] == ["lin_m4", "lin_m6", "lin_m8"]
  assert names["dyck_pcfg"] == ["mahto", "suzgun"]
  assert names["keyword_trees"] == (
      [f"length_{i}" for i in range(1, 11)] +
      [f"depth_{i}" for i in range(1, 11)])
  for n in names:
    for c in builders.builder_class(n).BUILDER_CONFIGS:
      assert (c.seed, c.scale) == (0, 1.0), (n, c.name)
  b = builders.builder("dyck_km/lin_m6", data_dir="/nonexistent")
  assert b.builder_config.name == "lin_m6"
  with pytest.raises(ValueError, match="unknown config 'lin_m5'"):
    builders.builder("dyck_km/lin_m5")
  assert build.parse_args(["dyck_pcfg/suzgun"]).names == ["dyck_pcfg/suzgun"]


def test_dyck_km(tmp_path):
  b, ds = build_tiny("dyck_km", tmp_path, name="lin_m4_tiny", seed=7,
                     scale=0.002)
  expected = dyck.make_splits("lin_m4", seed=7, scale=0.002)
  assert sorted(ds) == ["test", "train", "validation"]
  for split, gen in (("train", "train"), ("validation", "dev"),
                     ("test", "test")):
    got = [ds[split][i] for i in range(len(ds[split]))]
    assert len(got) == len(expected[gen]) == max(
        1, round(dict(dyck.PRESETS["lin_m4"].splits)[gen].num * 0.002))
    for ex, seq in zip(got, expected[gen]):
      assert ex["tokens"].dtype == np.int32
      np.testing.assert_array_equal(ex["tokens"], seq)
      np.testing.assert_array_equal(ex["closing_distances"],
                                    naive_distances(seq.tolist(), 2))
  lo, hi = b.info.metadata["lengths"]["test"]
  assert all(lo <= len(ds["test"][i]["tokens"]) - 2 <= hi
             for i in range(len(ds["test"])))
  assert b.info.metadata["seed"] == 7


def test_dyck_pcfg(tmp_path):
  _, ds = build_tiny("dyck_pcfg", tmp_path, name="suzgun_tiny",
                     preset="suzgun", seed=4, scale=0.002)
  expected = pcfg.make_splits("suzgun", seed=4, scale=0.002)
  assert sorted(ds) == ["test", "train"]          # Suzgun: no validation
  seen = set()
  for split in ("train", "test"):
    assert len(ds[split]) == len(expected[split]) > 1
    for i, seq in enumerate(expected[split]):
      ex = ds[split][i]
      np.testing.assert_array_equal(ex["tokens"], seq)
      assert ex["max_timescale"] == max(naive_distances(seq.tolist(), 2))
      seen.add(tuple(seq.tolist()))
  assert len(seen) == len(ds["train"]) + len(ds["test"])  # distinct


@pytest.mark.parametrize("config,i", [("length", 3), ("depth", 2)])
def test_keyword_trees(tmp_path, config, i):
  _, ds = build_tiny("keyword_trees", tmp_path, name=f"{config}_tiny",
                     experiment=config, i=i, seed=2, scale=0.003)
  make = {"length": keyword_trees.length_experiment,
          "depth": keyword_trees.depth_experiment}[config]
  expected = make(i, seed=2, scale=0.003)
  for split, gen in (("train", "train"), ("validation", "dev"),
                     ("test", "test")):
    assert len(ds[split]) == len(expected[gen])
    for j, e in enumerate(expected[gen]):
      ex = ds[split][j]
      tree = ex["tree"].decode() if isinstance(ex["tree"], bytes) \
          else ex["tree"]
      assert tree == keyword_trees.to_string(e.tree)
      np.testing.assert_array_equal(ex["tokens"], e.tokens)
      assert (ex["label"], ex["keyword_index"], ex["keyword_depth"]) == (
          e.label, e.keyword_index, e.keyword_depth)
      leaves, depths = naive_leaves_and_depths(tree)
      assert leaves == ex["tokens"].tolist()
      keywords = [t for t, tok in enumerate(leaves) if tok < 1000]
      assert keywords == [ex["keyword_index"]]
      assert ex["label"] == leaves[ex["keyword_index"]] // 100
      assert ex["keyword_depth"] == depths[ex["keyword_index"]]
      if config == "length":
        assert 10 * i - 9 <= len(leaves) <= 10 * i
      else:
        assert ex["keyword_depth"] in (i, i + 1)
        assert 21 <= len(leaves) <= 30


def test_bad_config_named(tmp_path):
  cls, config = tiny("dyck_km", name="bad_scale", scale=1.5)
  with pytest.raises(ValueError, match=r"dyck_km/bad_scale: scale must be"):
    cls(config=config, data_dir=str(tmp_path),
        file_format="array_record").download_and_prepare()
  cls, config = tiny("dyck_pcfg", name="bad_preset", preset="nope")
  with pytest.raises(ValueError, match=r"dyck_pcfg/bad_preset: unknown preset 'nope'"):
    cls(config=config, data_dir=str(tmp_path),
        file_format="array_record").download_and_prepare()
  cls, config = tiny("keyword_trees", name="bad_exp", experiment="width")
  with pytest.raises(ValueError, match=r"experiment must be one of"):
    cls(config=config, data_dir=str(tmp_path),
        file_format="array_record").download_and_prepare()


def test_markov_ptb(tmp_path):
  """From a tiny PTB fixture: lines re-cut from markov_corpus on train's
  bigrams, each split as many tokens as its source split."""
  manual = tmp_path / "manual" / "ptb"
  manual.mkdir(parents=True)
  src = {"train": [" a b c", " b a", " c c a b"], "validation": [" a c"],
         "test": [" b", " c a b a"]}
  files = {"train": "ptb.train.txt", "validation": "ptb.valid.txt",
           "test": "ptb.test.txt"}
  for split, name in files.items():
    (manual / name).write_text("\n".join(src[split]) + "\n")
  b = builders.prepare("markov_ptb", tmp_path / "data", manual.parent,
                       verify_checksums=False)
  assert "tensorflow" not in sys.modules
  ds = b.as_data_source()
  vocab = ["<eos>", "a", "b", "c"]                     # sorted words
  train = [w for l in src["train"] for w in l.split() + ["<eos>"]]
  ids = np.array([vocab.index(w) for w in train])
  seeds = dyck.split_seeds(0, ["train", "validation", "test"])
  for split in files:
    n = sum(len(l.split()) + 1 for l in src[split])
    drawn = [vocab[i] for i in markov.markov_corpus(ids, seeds[split], n)]
    expected = (" " + " ".join(drawn)).split(" <eos>")  # naive re-cut
    expected = [l.strip() for l in expected]
    if expected[-1] == "":
      expected.pop()
    got = [ds[split][i]["text"] for i in range(len(ds[split]))]
    got = [t.decode() if isinstance(t, bytes) else t for t in got]
    assert got == expected, split
    assert [ds[split][i]["line"] for i in range(len(got))] == list(
        range(len(got)))
    # Every bigram of the output is a bigram of train (read as a cycle).
    pairs = set(zip(train, train[1:] + train[:1]))
    assert set(zip(drawn, drawn[1:])) <= pairs
    # load_corpus ends the last line with <eos> even if the stream did not.
    loaded, _ = corpora.load_corpus("markov_ptb", split, tmp_path / "data")
    assert loaded.size == n + (drawn[-1] != "<eos>"), split
