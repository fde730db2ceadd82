"""TBPTT streams, padded/bucketed batches, cut sentences and k-fold splits."""

import json

import numpy as np
import pytest

from sorjax.data.batching import (SequenceBatcher, StreamBatcher, awd_seq_len,
                                  batchify, cut_sentences,
                                  cut_stream_sentences, kfold,
                                  length_boundaries, lm_pairs,
                                  split_documents)


def _distinct_stream(n, seed=0):
  """Tokens that are all different, so a token tells its source position."""
  return np.random.default_rng(seed).permutation(n).astype(np.int32)


def _roundtrip(state):
  return json.loads(json.dumps(state))  # what a checkpoint would store


# ================================================================ batchify

def test_batchify_hand_example():
  data, dropped = batchify(np.arange(11), 3)
  np.testing.assert_array_equal(data, [[0, 1, 2], [3, 4, 5], [6, 7, 8]])
  assert dropped == 2 and data.dtype == np.int32


@pytest.mark.parametrize("tokens, B, match", [
    ([], 2, "tokens is empty"),
    (np.arange(5), 3, "batch_size=3 is too large for 5 tokens"),
    (np.arange(5), 0, "batch_size must be an int >= 1"),
    (np.zeros((2, 3), np.int32), 1, "tokens must be a 1-D integer array"),
    (np.linspace(0, 1, 5), 1, "tokens must be a 1-D integer array"),
])
def test_batchify_errors(tokens, B, match):
  with pytest.raises(ValueError, match=match):
    batchify(tokens, B)


# ================================================================== TBPTT

@pytest.mark.parametrize("variable", [False, True])
def test_tbptt_continuity_and_shifted_targets(variable):
  n, B = 1003, 4
  source = _distinct_stream(n)
  where = np.argsort(source)  # token -> position in the source
  it = StreamBatcher(source, B, bptt=7, variable=variable, min_len=2,
                     seed=3)
  assert it.dropped == n % B
  batches = list(it)
  for prev, nxt in zip(batches, batches[1:]):
    # Row i of batch j+1 continues row i of batch j in the source.
    last = prev.inputs[np.arange(B), prev.lengths - 1]
    np.testing.assert_array_equal(where[nxt.inputs[:, 0]], where[last] + 1)
  seen = []
  for b in batches:
    L = int(b.lengths[0])
    assert b.inputs.shape == b.targets.shape == (B, L)
    assert (b.lengths == L).all()
    # targets = the next source token of each input.
    np.testing.assert_array_equal(where[b.targets], where[b.inputs] + 1)
    seen.append(b.inputs)
  # Every kept token except each row's last is an input exactly once.
  N = n // B
  rows = np.concatenate(seen, axis=1)
  np.testing.assert_array_equal(rows, source[:N * B].reshape(B, N)[:, :-1])


def test_fixed_bptt_windows_and_len():
  it = StreamBatcher(np.arange(2 * 23), 2, bptt=5)
  lengths = [int(b.lengths[0]) for b in it]
  assert lengths == [5, 5, 5, 5, 2] and len(it) == 5  # 22 input steps
  assert {b.lr_scale for b in StreamBatcher(np.arange(46), 2, 5)} == {1.0}
  # 22 tokens a stream: 21 input steps, the last window a single step
  it = StreamBatcher(np.arange(2 * 22), 2, bptt=5)
  batches = list(it)
  assert [int(b.lengths[0]) for b in batches] == [5, 5, 5, 5, 1]
  assert len(it) == 5
  assert batches[-1].inputs[:, 0].tolist() == [20, 42]
  assert batches[-1].targets[:, 0].tolist() == [21, 43]


def test_len_counts_the_windows_when_they_divide_the_input_steps():
  # 2 streams of 11 tokens: 10 input steps (the last token is only a
  # target), so bptt=5 makes exactly 2 windows, not ceil(11 / 5) = 3.
  it = StreamBatcher(np.arange(22), 2, bptt=5)
  assert len(it) == 2
  assert [b.lengths.tolist() for b in it] == [[5, 5], [5, 5]]
  # bptt=1: one window per input step.
  assert len(StreamBatcher(np.arange(22), 2, bptt=1)) == 10


def test_pad_to_gives_one_shape_and_masks_the_rest():
  it = StreamBatcher(_distinct_stream(500), 3, bptt=10, variable=True,
                     pad_to=16, pad_id=7, seed=1)
  for b in it:
    assert b.inputs.shape == b.targets.shape == (3, 16)
    L = int(b.lengths[0])
    assert 1 <= L <= 16
    assert (b.inputs[:, L:] == 7).all() and (b.targets[:, L:] == 7).all()


def test_awd_seq_len_statistics():
  rng = np.random.default_rng(0)
  draws = np.array([awd_seq_len(rng, 70) for _ in range(20000)])
  short = draws < 52.5  # N(35, 5) and N(70, 5) are 7 sigma apart
  assert abs(short.mean() - 0.05) < 0.008  # 5 binomial std
  assert abs(draws[~short].mean() - 69.5) < 0.2  # int() floors N(70, 5)
  assert abs(draws[~short].std() - 5.0) < 0.2
  assert abs(draws[short].mean() - 34.5) < 1.0
  small = np.array([awd_seq_len(rng, 8, min_len=5) for _ in range(2000)])
  assert small.min() == 5 and (small == 5).mean() > 0.2


def test_variable_batcher_statistics_lr_scale_and_seeding():
  tokens = np.zeros(2 * 60000, np.int32)
  it = StreamBatcher(tokens, 2, bptt=70, variable=True, seed=0)
  drawn = []
  for b in it:
    drawn.append(round(b.lr_scale * 70))
    # AWD-LSTM: lr_scale = seq_len / bptt (from the drawn length).
    assert abs(b.lr_scale * 70 - drawn[-1]) < 1e-9
  drawn = np.array(drawn)
  lengths = [int(b.lengths[0]) for b in StreamBatcher(tokens, 2, 70,
                                                      variable=True)]
  np.testing.assert_array_equal(lengths[:-1], drawn[:-1])  # the last is cut
  assert sum(lengths) == 60000 - 1
  assert abs((drawn < 52.5).mean() - 0.05) < 0.03 and drawn.min() >= 5
  # The next epoch and another seed draw different lengths.
  epoch1 = [int(b.lengths[0]) for b in it]
  other = [int(b.lengths[0]) for b in StreamBatcher(tokens, 2, 70,
                                                    variable=True, seed=1)]
  assert epoch1[:20] != lengths[:20] and other[:20] != lengths[:20]


@pytest.mark.parametrize("kwargs, match", [
    ({"bptt": 0}, "bptt must be an int >= 1"),
    ({"bptt": 5, "batch_size": 600}, "batch_size=600 is too large"),
    ({"bptt": 5, "pad_to": 4}, "pad_to must be an int >= 5"),
    ({"bptt": 5, "p": 1.5}, r"p must be a finite number in \[0, 1\], got 1.5"),
    ({"bptt": 5, "min_len": 0}, "min_len"),
    ({"bptt": 5, "p": "0.5"}, "p must be a finite number in .*, got '0.5'"),
    ({"bptt": 5, "sigma": None}, "sigma must be a finite number >= 0, got None"),
    ({"bptt": 5, "sigma": float("inf")}, "sigma must be a finite number >= 0, got inf"),
])
def test_stream_batcher_errors(kwargs, match):
  kwargs = {"batch_size": 2, **kwargs}
  with pytest.raises(ValueError, match=match):
    StreamBatcher(np.arange(1000), **kwargs)
  with pytest.raises(ValueError, match="tokens is empty"):
    StreamBatcher([], 2, 5)


@pytest.mark.parametrize("variable", [False, True])
def test_stream_resume_equals_uninterrupted(variable):
  tokens = _distinct_stream(3000)
  make = lambda: StreamBatcher(tokens, 3, 9, variable=variable, min_len=3,
                               seed=5)
  ref = make()
  expected = list(ref) + list(ref)  # two epochs
  it = make()
  got = [next(it) for _ in range(40)]
  state = _roundtrip(it.get_state())
  fresh = make()
  fresh.set_state(state)
  got += list(fresh)
  assert fresh.epoch == 1
  got += list(fresh)
  assert len(got) == len(expected)
  for a, b in zip(got, expected):
    np.testing.assert_array_equal(a.inputs, b.inputs)
    np.testing.assert_array_equal(a.targets, b.targets)
    assert a.lr_scale == b.lr_scale


def test_stream_state_must_match_the_data():
  it = StreamBatcher(np.arange(1000), 2, 5)
  state = it.get_state()
  with pytest.raises(ValueError, match="batch_size=2 .* batch_size=4"):
    StreamBatcher(np.arange(1000), 4, 5).set_state(state)
  with pytest.raises(ValueError, match="lacks the key 'position'"):
    it.set_state({k: v for k, v in state.items() if k != "position"})
  with pytest.raises(ValueError, match="position 999"):
    it.set_state({**state, "position": 999})
  with pytest.raises(ValueError, match="position must be an int >= 0, got "
                                       "3.7"):
    it.set_state({**state, "position": 3.7})
  it.set_state({**state, "position": np.int64(3)})
  assert next(it).inputs[0, 0] == 3


@pytest.mark.parametrize("name, value", [
    ("p", 0.5), ("sigma", 2.0), ("min_len", 3), ("pad_id", 7)])
def test_stream_state_must_match_every_setting(name, value):
  make = lambda **kw: StreamBatcher(np.arange(1000), 2, 5, variable=True,
                                    pad_to=30, **kw)
  state = _roundtrip(make().get_state())
  make().set_state(state)
  with pytest.raises(ValueError, match=f"saved with {name}=.* this iterator "
                                       f"has {name}={value}"):
    make(**{name: value}).set_state(state)


# ============================================================ sequences

def _examples(n=37, seed=0, max_len=20):
  rng = np.random.default_rng(seed)
  return [rng.integers(1, 50, rng.integers(1, max_len + 1)).astype(np.int32)
          for _ in range(n)]


def _check_epoch(batcher, examples, B):
  """Each example exactly once, intact, padded; returns the batches."""
  batches = list(batcher)
  index = np.concatenate([b.index for b in batches])
  real = index[index >= 0]
  np.testing.assert_array_equal(np.sort(real), np.arange(len(examples)))
  for b in batches:
    assert b.inputs.shape[0] == B == len(b.lengths) == len(b.index)
    for row, n in enumerate(b.index):
      L = int(b.lengths[row])
      if n < 0:
        assert L == 0 and (b.inputs[row] == batcher.pad_id).all()
        continue
      assert L == len(examples[n])
      np.testing.assert_array_equal(b.inputs[row, :L], examples[n])
      assert (b.inputs[row, L:] == batcher.pad_id).all()
  return batches


def test_bucketed_batches_keep_every_example_once_and_few_shapes():
  examples, B, bounds = _examples(), 4, (5, 10, 20)
  batcher = SequenceBatcher(examples, B, boundaries=bounds, seed=1,
                            pad_id=0)
  batches = _check_epoch(batcher, examples, B)
  assert len(batches) == len(batcher)
  assert {b.inputs.shape for b in batches} <= {(B, t) for t in bounds}
  for b in batches:  # each batch sits in the smallest fitting bucket
    T = b.inputs.shape[1]
    lower = max([0] + [t for t in bounds if t < T])
    real = b.lengths[b.index >= 0]
    assert (real <= T).all() and (real > lower).all()
  # Bucketing pads less than one bucket padded to the longest example.
  padded = sum(b.inputs.size for b in batches)
  one_bucket = sum(b.inputs.size for b in SequenceBatcher(
      examples, B, boundaries=(20,)))
  assert padded < one_bucket


def test_unbucketed_batches_round_up_to_multiple_and_need_not_fill():
  examples = _examples(seed=2)
  batcher = SequenceBatcher(examples, 5, multiple=8, fill=False,
                            shuffle=False)
  batches = list(batcher)
  assert sum(len(b.index) for b in batches) == len(examples)
  assert [len(b.index) for b in batches] == [5] * 7 + [2]
  np.testing.assert_array_equal(np.concatenate([b.index for b in batches]),
                                np.arange(len(examples)))  # in order
  for b in batches:
    T = b.inputs.shape[1]
    assert T % 8 == 0 and T - 8 < b.lengths.max() <= T


def test_shuffling_is_seeded_and_changes_with_the_epoch():
  examples = _examples()
  order = lambda it: np.concatenate([b.index for b in it]).tolist()
  a, b = SequenceBatcher(examples, 4, seed=3), SequenceBatcher(examples, 4,
                                                               seed=3)
  first = order(a)
  assert first == order(b)
  assert order(a) != first  # epoch 1 differs from epoch 0
  assert order(SequenceBatcher(examples, 4, seed=4)) != first


def test_shuffle_permutes_the_batch_order_across_buckets():
  """The docstring: the examples of each bucket *and the order of the
  batches* are permuted; without the second permutation the batches would
  come bucket by bucket (all short ones first) in every epoch."""
  examples = [np.ones(n, np.int32) for n in [2] * 16 + [9] * 16]
  orders = []
  for seed in range(4):
    it = SequenceBatcher(examples, 4, boundaries=(4, 12), seed=seed)
    for _ in range(2):                                     # two epochs
      orders.append([b.inputs.shape[1] for b in it])
  for T in orders:                           # 4 batches of each bucket
    assert sorted(T) == [4] * 4 + [12] * 4
  # Grouped by bucket, an order is 4 4 4 4 12 12 12 12 (or the reverse);
  # a uniform batch order is so with probability 2 / C(8, 4) = 1/35 each.
  grouped = {(4,) * 4 + (12,) * 4, (12,) * 4 + (4,) * 4}
  assert sum(tuple(T) not in grouped for T in orders) >= 6


def test_per_step_and_per_example_targets():
  sentences = [np.array([5, 6, 7, 8]), np.array([9, 10])]
  inputs, targets = lm_pairs(sentences, bos=1)
  assert [x.tolist() for x in inputs] == [[1, 5, 6, 7], [1, 9]]
  assert [y.tolist() for y in targets] == [[5, 6, 7, 8], [9, 10]]
  batch = next(SequenceBatcher(inputs, 2, targets=targets, shuffle=False,
                               pad_id=0))
  np.testing.assert_array_equal(batch.targets, [[5, 6, 7, 8], [9, 10, 0, 0]])
  np.testing.assert_array_equal(batch.lengths, [4, 2])
  labels = next(SequenceBatcher(sentences, 3, targets=[3, 1],
                                shuffle=False))
  np.testing.assert_array_equal(labels.targets, [3, 1, 0])  # + filler row
  np.testing.assert_array_equal(labels.index, [0, 1, -1])


def test_sequence_resume_equals_uninterrupted():
  examples = _examples(n=50)
  make = lambda: SequenceBatcher(examples, 4, boundaries=(8, 20), seed=9)
  ref = make()
  expected = list(ref) + list(ref)
  it = make()
  got = [next(it) for _ in range(5)]
  fresh = make()
  fresh.set_state(_roundtrip(it.get_state()))
  got += list(fresh) + list(fresh)
  assert len(got) == len(expected)
  for a, b in zip(got, expected):
    np.testing.assert_array_equal(a.index, b.index)
    np.testing.assert_array_equal(a.inputs, b.inputs)
  with pytest.raises(ValueError, match="num_examples=50 .* num_examples=49"):
    SequenceBatcher(examples[:49], 4).set_state(it.get_state())
  with pytest.raises(ValueError, match="batch 99 beyond"):
    it.set_state({**it.get_state(), "batch": 99})


def test_sequence_resume_at_the_end_of_an_epoch():
  """A state saved after an epoch's last batch (before the loop sees
  StopIteration) restores, and continues with the next epoch."""
  examples = _examples(n=10)
  make = lambda: SequenceBatcher(examples, 4, seed=2)
  ref = make()
  list(ref)
  expected = list(ref)                              # epoch 1
  it = make()
  for _ in range(len(it)):                          # all of epoch 0 ...
    next(it)
  state = _roundtrip(it.get_state())
  assert state["batch"] == len(it) == 3             # ... but not its end
  fresh = make()
  fresh.set_state(state)
  assert list(fresh) == []                          # epoch 0 is over
  got = list(fresh)
  assert len(got) == len(expected)
  for a, b in zip(got, expected):
    np.testing.assert_array_equal(a.index, b.index)


@pytest.mark.parametrize("kwargs, match", [
    ({"fill": False}, "fill=1 .* fill=0"),
    ({"boundaries": (8, 16, 20)}, r"boundaries=\[8, 20\] .* "
                                  r"boundaries=\[8, 16, 20\]"),
    ({"boundaries": None}, r"boundaries=\[8, 20\] .* boundaries=\[\]"),
])
def test_sequence_state_must_match_every_setting(kwargs, match):
  examples = _examples(n=50)
  make = lambda **kw: SequenceBatcher(examples, 4, **{
      "boundaries": (8, 20), **kw})
  state = _roundtrip(make().get_state())
  make().set_state(state)
  with pytest.raises(ValueError, match=match):
    make(**kwargs).set_state(state)
  unbucketed = _roundtrip(make(boundaries=None).get_state())
  with pytest.raises(ValueError, match="multiple=1 .* multiple=8"):
    make(boundaries=None, multiple=8).set_state(unbucketed)


@pytest.mark.parametrize("args, kwargs, match", [
    ([], {}, "inputs is empty"),
    ([[1, 2], []], {}, r"inputs\[1\] is empty"),
    ([[1, 2], [1.5]], {}, r"inputs\[1\] must be a 1-D integer array"),
    ([[1, 2, 3]], {"boundaries": (2,)}, r"inputs\[0\] has length 3 > .* 2"),
    ([[1]], {"boundaries": (4, 2)}, "strictly increasing"),
    ([[1]], {"boundaries": (4,), "multiple": 2}, "not both"),
    ([[1, 2]], {"targets": [[1]]}, r"targets\[0\] has shape"),
    ([[1, 2]], {"targets": [1, 2]}, "2 targets for 1 inputs"),
])
def test_sequence_batcher_errors(args, kwargs, match):
  with pytest.raises(ValueError, match=match):
    SequenceBatcher(args, 2, **kwargs)
  with pytest.raises(ValueError, match="batch_size"):
    SequenceBatcher([[1]], 0)


def test_length_boundaries():
  lengths = np.arange(1, 101)
  assert length_boundaries(lengths, 4, multiple=8) == (32, 56, 80, 104)
  assert length_boundaries([3, 3, 3], 4, multiple=4) == (4,)
  # index ceil(3 * 0.5) = 2 of [1, 2, 3, 4]: the length 3, not 2 or 2.5
  assert length_boundaries([4, 1, 3, 2], 2, multiple=1) == (3, 4)
  assert length_boundaries([1, 2, 3, 4, 5], 4, multiple=1) == (2, 3, 4, 5)
  with pytest.raises(ValueError, match="num_buckets"):
    length_boundaries(lengths, 0)


# ========================================================= partial sentences

def test_cut_sentences_keeps_prefixes_and_counts_cuts():
  # Renganathan & Singh 6.1: train on the first `cutoff` characters.
  sentences = [np.arange(30), np.arange(25), np.arange(3)]
  cut, num_cut = cut_sentences(sentences, 25)
  assert [len(s) for s in cut] == [25, 25, 3] and num_cut == 1
  np.testing.assert_array_equal(cut[0], np.arange(25))
  with pytest.raises(ValueError, match="cutoff must be an int >= 1"):
    cut_sentences(sentences, 0)


def test_cut_stream_sentences_keeps_each_lines_prefix_and_its_eos():
  E = 9  # eos
  ids = [1, 2, 3, 4, E, 5, E, E, 6, 7, 8, E, 1, 2, 3]  # last line: no eos
  cut, num_cut = cut_stream_sentences(ids, E, 2)
  np.testing.assert_array_equal(
      cut, [1, 2, E, 5, E, E, 6, 7, E, 1, 2])
  assert num_cut == 3 and cut.dtype == np.int32
  same, n = cut_stream_sentences(ids, E, 10)  # nothing longer: unchanged
  np.testing.assert_array_equal(same, ids)
  assert n == 0
  with pytest.raises(ValueError, match="cutoff must be an int >= 1"):
    cut_stream_sentences(ids, E, 0)
  with pytest.raises(ValueError, match="ids must be a 1-D integer array"):
    cut_stream_sentences(np.ones((2, 2), np.int32), E, 2)


def test_split_documents_cuts_after_each_eos_and_keeps_a_trailing_piece():
  E = 9
  ids = [1, 2, E, E, 3, E, 4, 5]            # an empty line, then no eos
  docs = split_documents(ids, E)
  assert [d.tolist() for d in docs] == [[1, 2, E], [E], [3, E], [4, 5]]
  assert all(d.dtype == np.int32 for d in docs)
  np.testing.assert_array_equal(np.concatenate(docs), ids)
  ended = split_documents([1, E, 2, E], E)   # no empty document at the end
  assert [d.tolist() for d in ended] == [[1, E], [2, E]]
  assert [d.tolist() for d in split_documents([], E)] == [[]]
  with pytest.raises(ValueError, match="split_documents: ids must be a 1-D"):
    split_documents(np.ones((2, 2), np.int32), E)
  with pytest.raises(ValueError, match="eos_id must be an int"):
    split_documents([1, 2], -1)


# ================================================================== k-fold

def test_kfold_partitions_are_disjoint_covering_and_deterministic():
  n = 103
  folds = kfold(n, 5, seed=7, valid_fraction=0.1)
  tests = np.concatenate([f.test for f in folds])
  np.testing.assert_array_equal(np.sort(tests), np.arange(n))  # disjoint
  assert {len(f.test) for f in folds} <= {20, 21}
  for f in folds:
    parts = np.concatenate([f.train, f.valid, f.test])
    np.testing.assert_array_equal(np.sort(parts), np.arange(n))
    assert len(f.valid) == round(0.1 * (n - len(f.test)))
  big = kfold(1000, 5, seed=7, valid_fraction=0.1)
  for f, fold in enumerate(big):  # valid is drawn from every other fold
    assert all(np.intersect1d(fold.valid, g.test).size > 5
               for h, g in enumerate(big) if h != f)
  again = kfold(n, 5, seed=7, valid_fraction=0.1)
  for f, g in zip(folds, again):
    for a, b in zip(f, g):
      np.testing.assert_array_equal(a, b)
  other = kfold(n, 5, seed=8, valid_fraction=0.1)
  assert any(not np.array_equal(f.test, g.test) for f, g in zip(folds, other))


def test_kfold_valid_is_the_nearest_count_and_a_random_draw():
  # 10 examples, k=2: 5 left for train + valid; 0.35 * 5 = 1.75 -> 2
  # held out (the nearest count, as 0.1 * 82 = 8.2 -> 8 above), not 1.
  for fold in kfold(10, 2, seed=0, valid_fraction=0.35):
    assert (len(fold.train), len(fold.valid), len(fold.test)) == (3, 2, 5)
  folds = kfold(7, 2, seed=0, valid_fraction=0.5)   # 3 and 4 left
  assert sorted(len(f.train) + len(f.valid) for f in folds) == [3, 4]
  assert [len(f.valid) for f in folds] == [2, 2]    # 1.5 -> 2 and 2
  # A seeded draw of the rest, not its lowest example numbers: over 1000
  # examples a fold's 80 validation examples spread over the whole range
  # (their mean is ~500, sd ~32, where the 80 lowest would average ~50).
  for fold in kfold(1000, 5, seed=3, valid_fraction=0.1):
    assert len(fold.valid) == 80
    assert 350 < fold.valid.mean() < 650
    assert fold.valid.max() > 900 and fold.valid.min() < 100


@pytest.mark.parametrize("args, kwargs, match", [
    ((10, 1), {}, "k must be an int >= 2"),
    ((3, 5), {}, "num_examples must be an int >= 5"),
    ((10, 2), {"valid_fraction": 1.0}, "valid_fraction"),
])
def test_kfold_errors(args, kwargs, match):
  with pytest.raises(ValueError, match=match):
    kfold(*args, **kwargs)


def test_ids_are_int32_and_non_negative():
  with pytest.raises(ValueError, match=r"batchify: tokens has id "
                                       r"1099511627776 at position 0"):
    batchify(np.array([2**40, 1, 2, 3]), 2)
  with pytest.raises(ValueError, match="batchify: tokens has id -1"):
    batchify(np.array([1, -1, 2, 3]), 2)
  with pytest.raises(ValueError, match=r"SequenceBatcher: inputs\[1\] has "
                                       r"id -2 at position 0"):
    SequenceBatcher([[1, 2], [-2]], 1)
  for bos in (1.5, -1, True):
    with pytest.raises(ValueError, match="lm_pairs: bos must be an int >= 0"):
      lm_pairs([[5, 6]], bos=bos)
  with pytest.raises(ValueError, match="lm_pairs: bos=4294967296 does not "
                                       "fit int32"):
    lm_pairs([[5, 6]], bos=2**32)
  with pytest.raises(ValueError, match="cut_stream_sentences: eos_id must be "
                                       "an int >= 0, got 0.5"):
    cut_stream_sentences(np.array([1, 2, 0, 3, 4, 0]), eos_id=0.5, cutoff=1)


def test_bool_options_must_be_bools():
  with pytest.raises(TypeError, match="SequenceBatcher: shuffle must be a "
                                      "bool, got 'no'"):
    SequenceBatcher([[1, 2]], 1, shuffle="no")
  with pytest.raises(TypeError, match="SequenceBatcher: fill must be a bool"):
    SequenceBatcher([[1, 2]], 1, fill=0)
  with pytest.raises(TypeError, match="StreamBatcher: variable must be a "
                                      "bool"):
    StreamBatcher(np.arange(20), 2, 3, variable="no")
