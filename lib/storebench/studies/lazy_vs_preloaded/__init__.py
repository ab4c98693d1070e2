"""The lazy_vs_preloaded study: its grid (``grid``), tables, figures and findings
(``report``), guide rows (``guide``), case functions (``cases``) and ``STUDY`` (``study``)."""
