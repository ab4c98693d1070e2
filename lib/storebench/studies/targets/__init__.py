"""The targets study: its grid (``grid``), tables, figures and findings (``report``), guide
row (``guide``), case functions (``cases``) and ``STUDY`` (``study``)."""
