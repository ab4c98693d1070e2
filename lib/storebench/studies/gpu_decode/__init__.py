"""The gpu_decode study: decode on the device, a real model's step as the demand, and how
many CPU cores one accelerator needs. ``study`` holds its grid, figures, findings and guide
rows (``STUDY``); ``cases`` the light case functions; ``storebench.gpu_study`` the one command that
runs it on a GPU machine (``make gpu-study``)."""
