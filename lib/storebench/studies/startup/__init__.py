"""The startup study: its grid (``grid``), figure and findings (``report``), guide rows
(``guide``), case functions (``cases``) and ``STUDY`` (``study``)."""
