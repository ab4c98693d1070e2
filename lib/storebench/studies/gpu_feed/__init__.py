"""The gpu_feed study: its grid (``study``) and case functions (``cases``)."""
