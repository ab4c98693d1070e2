"""The remote study: its grid (``study``) and case functions (``cases``)."""
