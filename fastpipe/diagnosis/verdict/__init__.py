"""The last phase of a diagnosis, the verdict: step times and stage costs turned into milliseconds per stage and
the stages named (:mod:`._attribute`), the saturation caveat settled by stage costs (:mod:`._saturation`), the
report's caveats and notes (:mod:`._caveats`), the fix for each named stage (:mod:`._advice`), and the report
itself (:mod:`._report`).

May import every other phase; none of them imports the verdict.
"""
