"""Phase 1 of a diagnosis, finding the stages: where a dataset (or a stream) keeps its transform stages, so that
the ladder can cache the output of each (:mod:`._pipeline`, whose :func:`find_pipeline` is public through
:mod:`fastpipe.diagnosis`), presets opened into their stages (:mod:`._holder`), and what each stage is
(:mod:`._catalog`; its :func:`facts_for` and :class:`TransformFacts` are public through :mod:`fastpipe.diagnosis`).

May import :mod:`fastpipe.diagnosis.runtime`; nothing above it.
"""
