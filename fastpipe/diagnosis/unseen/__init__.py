"""What the cache ladder cannot see: the steady state of the workers is its whole view, so three things are measured
apart, each in its own short pass outside the timed steps:

* :mod:`._streams`: a stream (``IterableDataset``) that does not split its source by worker or rank repeats itself;
  a bounded number of items per worker (and per rank) is fingerprinted and compared;
* :mod:`._main_process`: the work the training process does for the loader (the sampler, collate without workers,
  pinning), which lands in the ladder's collate/IPC span;
* :mod:`._startup`: the time to the first batch, split into worker start, the dataset's transfer, ``worker_init_fn``
  and the first fetch, with the projected saving of each fix.

May import the runtime, discovery, memory, ladder and stage-cost phases; the verdict reads what it measured.
Public (re-exported by :mod:`fastpipe.diagnosis` and ``fastpipe``): ``check_stream`` and ``measure_startup``, so a
stream, or a loop that ``fastpipe.watch`` reports waiting at its epochs' starts, can be checked on its own.
"""
