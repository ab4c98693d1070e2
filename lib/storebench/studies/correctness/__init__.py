"""The correctness study: its grid (``grid``), table, figure and findings (``report``), guide
row (``guide``), case functions (``cases``), measures (``measures``) and ``STUDY``
(``study``)."""
