"""The out_of_core study: its grid (``study``) and case functions (``cases``)."""
