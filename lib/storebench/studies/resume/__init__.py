"""The resume study: which loaders resume an epoch exactly after a SIGKILL."""
