"""Builds the real corpora offline (TFDS's `tfds build` needs TensorFlow).

    python -m sorjax.data.build ptb wikitext2 [--data_dir DIR]
        [--manual_dir DIR] [--noverify_checksums]
    python -m sorjax.data.build all
    python -m sorjax.data.build ptb_char_maupome/wsj_raw --manual_dir RAW_WSJ

Writes array_record files to `<data_dir>/<name>/[<config>/]<version>/`
(default data_dir: TFDS's, ~/tensorflow_datasets or $TFDS_DATA_DIR) and
prints each split's size and what was skipped. Where the source files are
looked for: see sorjax.data.builders.
"""

from __future__ import annotations

import argparse
import sys

from sorjax.data import builders


def parse_args(argv):
  parser = argparse.ArgumentParser(
      prog="python -m sorjax.data.build",
      description="Build sorjax's real corpora as TFDS array_record "
                  "datasets, without TensorFlow.")
  parser.add_argument(
      "names", nargs="+", metavar="NAME",
      help=f"corpus name, 'name/config', or 'all': {', '.join(builders.NAMES)}")
  parser.add_argument("--data_dir", default=None,
                      help="where to write the datasets (default: TFDS's)")
  parser.add_argument("--manual_dir", default=None,
                      help="folder holding the source files (or a copy of "
                           "the shared data folder with one subfolder per "
                           "corpus)")
  parser.add_argument("--noverify_checksums", dest="verify_checksums",
                      action="store_false",
                      help="accept source files whose sha256 differs from "
                           "the published one")
  args = parser.parse_args(argv)
  names = []
  for name in args.names:
    if name == "all":
      names.extend(builders.NAMES)
      continue
    try:
      builders.split_name(name)
    except ValueError as e:
      parser.error(f"NAME: {e}")
    names.append(name)
  args.names = list(dict.fromkeys(names))
  return args


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  tfds.disable_progress_bar()
  for name in args.names:
    try:
      b = builders.prepare(name, args.data_dir, args.manual_dir,
                           verify_checksums=args.verify_checksums,
                           strict=True)
    except (FileNotFoundError, ValueError) as e:  # missing or bad sources
      print(f"error: {e}", file=sys.stderr)
      return 1
    sizes = ", ".join(f"{split} {info.num_examples:,}"
                      for split, info in b.info.splits.items())
    meta = b.info.metadata
    print(f"{name}: {sizes} examples in {b.data_dir} "
          f"(source: {meta.get('source', 'prepared earlier')})")
    for split, reasons in meta.get("skipped", {}).items():
      for reason, count in reasons.items():
        print(f"  {split}: skipped {count:,} {reason}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
