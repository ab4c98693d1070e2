"""The gpu_feed study: its grid (``grid``), table, figure and findings (``report``), guide
row (``guide``), case functions (``cases``) and ``STUDY`` (``study``)."""
