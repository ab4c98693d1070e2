"""The targets study: its grid (``study``) and case functions (``cases``)."""
