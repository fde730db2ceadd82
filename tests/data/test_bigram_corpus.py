"""The character-bigram LM corpus (Maupome & Meurs 4.2) is the same text as
the character corpus, re-cut into pairs within words."""

from sorjax.data.corpora import load_corpus


def test_bigram_corpus_spells_the_char_corpus(shared_data, monkeypatch,
                                              tmp_path):
  monkeypatch.setenv("SORJAX_DATA_DIR", shared_data)
  ids, vocab = load_corpus("ptb_char_maupome_bigram", "valid",
                           data_dir=str(tmp_path))
  cids, cvocab = load_corpus("ptb_char_maupome", "valid",
                             data_dir=str(tmp_path))
  text = "".join("\n" if s == "<eos>" else s for s in vocab.decode(ids[:5000]))
  ctext = "".join("\n" if s == "<eos>" else s
                  for s in cvocab.decode(cids[:len(text)]))
  assert text == ctext
  assert all(len(s) <= 2 or s.startswith("<") for s in vocab.decode(
      range(len(vocab))))
  assert 0.55 < len(ids) / len(cids) < 0.75    # about 36% fewer symbols
  assert "st" in vocab and "at" in vocab
  # an open vocabulary: a pair that training never had is <unk>, as a
  # test split's rare bigram must be (the character corpus is closed)
  assert vocab.unk == "<unk>" and cvocab.unk is None
  assert vocab.encode(["\x01\x02"]).tolist() == [vocab.unk_id]
