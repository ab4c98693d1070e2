"""The gpu_decode study: decode on the device, a real model's step as the demand, and how
many CPU cores one accelerator needs. Its grid (``grid``), tables, figures and findings
(``report``), guide row (``guide``), case functions (``cases``) and ``STUDY`` (``study``);
``storebench.gpu_study`` is the one command that runs it on a GPU machine
(``make gpu-study``)."""
