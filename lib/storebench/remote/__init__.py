"""Datasets in object storage (S3 or compatible) and the network between."""
