"""The peers study: its grid (``study``) and case functions (``cases``)."""
