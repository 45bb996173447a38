"""Data sources read by example index, and the order a run reads them in.

    source = towerlib.TFRecords("/data/train-*", decode=parse)
    towerlib.global_batch_input(source, 1024, seed=1, workers=group)

The package, one job per module:

  sources.py         TFRecords, FixedLengthRecords, arrays: n, fingerprint, reads by index
  tfrecord_index.py  a TFRecord shard's record offsets, built from its headers, cached
  crc32c.py          CRC-32C and TFRecord's masked form, for the length headers
  order.py           the example and augmentation seed of each position; a step's batch
"""
