"""Data: synthetic languages with oracles, real corpora, tokenisers, batching.

Submodules: `dyck` (Dyck-(k,m) PDFA and oracle), `pcfg` (Dyck-2 PCFG),
`keyword_trees` (Le & Zuidema's keyword task), `markov` (bigram-resampled
control corpus), `synthetic` (all four), `tokenize`, `vocab`, `batching`,
`corpora` (offline TFDS corpora, `load_corpus`), `builders` (the TFDS
builders of datasets/; both import tensorflow_datasets, so they are not
imported here: `from sorjax.data.corpora import load_corpus`).
"""

from sorjax.data import batching, dyck, keyword_trees, markov, pcfg, \
    synthetic, tokenize, vocab
from sorjax.data.batching import (Fold, SequenceBatch, SequenceBatcher,
                                  StreamBatch, StreamBatcher, awd_seq_len,
                                  batchify, cut_sentences,
                                  cut_stream_sentences, kfold,
                                  length_boundaries, lm_pairs)
from sorjax.data.tokenize import Tokenizer, letters_only, read_lines
from sorjax.data.vocab import Encoded, Vocab, encode_lines

__all__ = ["batching", "dyck", "keyword_trees", "markov", "pcfg",
           "synthetic", "tokenize", "vocab", "Fold", "SequenceBatch",
           "SequenceBatcher", "StreamBatch", "StreamBatcher", "awd_seq_len",
           "batchify", "cut_sentences", "cut_stream_sentences", "kfold",
           "length_boundaries", "lm_pairs", "Tokenizer", "letters_only",
           "read_lines", "Encoded", "Vocab", "encode_lines"]
