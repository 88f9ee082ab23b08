"""Phase 0 of a diagnosis, the services every phase uses: the user's state kept and restored around a run
(:mod:`._snapshot`), agreement between DDP ranks (:mod:`._ddp`), work with a deadline (:mod:`._timeout`), and a
measuring thread kept out of the script's CPU thread pool (:mod:`._threads`).

Imports nothing else of :mod:`fastpipe.diagnosis`. Nothing here is public; import from :mod:`fastpipe.diagnosis`.
"""
