"""Data: synthetic languages with oracles, real corpora, tokenisers, batching."""
