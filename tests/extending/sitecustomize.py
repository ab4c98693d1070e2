"""On this folder's PYTHONPATH, every interpreter (the test's, each case worker) registers the
toy format and the toy study: one registry line each."""

from storebench.formats import FORMATS
from storebench.studies import STUDIES

FORMATS.register("toy", "toy_format")
STUDIES.register("toy", "toy_study.study")
