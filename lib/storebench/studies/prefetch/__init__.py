"""The prefetch study: its grid (``study``) and case functions (``cases``)."""
