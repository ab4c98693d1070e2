"""The resume study: which loaders resume an epoch exactly after a SIGKILL. Its grid
(``grid``), table, figure and findings (``report``), guide row (``guide``), case functions
(``cases``) and ``STUDY`` (``study``)."""
