"""The formats study: its grid (``study``) and case functions (``cases``)."""
