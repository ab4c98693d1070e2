"""The measurement harness: cases run in fresh subprocesses under controlled cache state,
tidy results with one fixed schema, machine limits and env.json from the same run.

- ``cache``: evict / prewarm / ``resident_fraction`` (mincore) / ``prepare``
- ``metrics``: process-tree PSS/USS peaks and CPU time (``RegionMeasurement``)
- ``limits``: DRAM, page-cache, cold sequential and cold 4 KiB random read limits
- ``envinfo``: env.json (machine, storage, versions, git, CUDA, limits)
- ``schema``: result columns, ``validate``, append-safe ``ResultsWriter``
- ``runner``: ``Case``, ``Trial``, ``run_case``, ``run_study``; ``worker`` runs one case
- ``plan``: per-profile repeats, case timeout and grid size (``plan_for``)
- ``cases``: the case functions; ``studies``: the ``STUDIES`` registry and knob variants
- ``targets``: the performance targets and their thresholds (``TARGETS``)
"""
