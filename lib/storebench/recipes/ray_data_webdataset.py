"""Ray Data over the webdataset layout: `ray.data.read_webdataset`, decode and the training crop in
`map_batches`, `iter_torch_batches` (see ``recipes.ray_data``)."""

from .ray_data import ray_data_recipe

RECIPE = ray_data_recipe(name="ray-data-webdataset", layout="webdataset",
                         loader="ray_data_webdataset",
                         reader="ray.data.read_webdataset over tar shards "
                                "(decoder=None), shards shuffled")
