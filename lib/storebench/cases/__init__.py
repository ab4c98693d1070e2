"""Case functions of the studies that have their own (``storebench.cases.<study>``): what a
case worker imports and runs, kept apart from the study modules' figures and findings
(pandas, matplotlib) so that a fresh case process starts in a fraction of the time. Each
study module (``storebench.studies.<study>``) names its case functions by their path here;
the loader studies use ``storebench.bench.cases.loader_epoch_case``."""
