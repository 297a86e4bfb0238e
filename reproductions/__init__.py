"""Reproductions: regenerate the paper's tables and worked numbers into ``reports/``.

Every reproduction is declared once in :mod:`aiayn.reproductions.registry` (name, title,
deterministic or measured, entry point, the command that measures it); ``aiayn reproduce`` runs
them (:mod:`aiayn.reproductions.runner`) and writes ``reports/README.md`` as the index.

Printed values come from ``aiayn.reproductions.paper`` (the paper's numbers as data, with
provenance); a report's "ours" column is always computed, in the run or in the measurement whose
results the report stores. Deterministic reports are byte-identical from run to run apart from the
signature line; measured ones (timings, fetched data, training runs) store their results and are
re-rendered from them, and the drift test (tests/test_reproductions.py) covers both kinds.
"""
