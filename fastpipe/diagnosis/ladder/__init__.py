"""Phase 2 of a diagnosis, the cache ladder: the points (:mod:`._cachepoint`) and the plan that orders them
(:mod:`._plan`); the datasets that replay a point inside the workers, for map datasets (:mod:`._cache`) and
streams (:mod:`._stream`), and the choice between them (:mod:`._serve`); the runner that builds each point's
loader and measures it (:mod:`._points`, :mod:`._measure`, with :mod:`._noise` the one noise estimator and
:mod:`._cpu` the CPU monitor); a loader's own stage clocks (:mod:`._loader_stages`); the variable-input probe
(:mod:`._variable`); and what a point measured (:mod:`._results`).

May import :mod:`~fastpipe.diagnosis.runtime`, :mod:`~fastpipe.diagnosis.discovery` and
:mod:`~fastpipe.diagnosis.memory`; never the stage costs or the verdict, which read its results.
"""
