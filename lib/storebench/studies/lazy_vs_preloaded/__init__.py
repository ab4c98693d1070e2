"""The lazy_vs_preloaded study: its grid (``study``) and case functions (``cases``)."""
