"""The memory side of a diagnosis: shared-memory and pinned-memory probes (:mod:`._probes`), the shared-memory
budget a loader setting needs (:mod:`._shm_budget`), the loader pass that measures workers' memory
(:mod:`._loader`), copy-on-read growth named by the dataset attribute that causes it (:mod:`._copy_on_read`), and
the report's memory section that runs them (:mod:`._section`).

May import :mod:`~fastpipe.diagnosis.runtime` and :mod:`~fastpipe.diagnosis.discovery`; the ladder reads each
point's memory through :mod:`._section`, so nothing here imports the ladder.
"""
