"""Ray Data over the rawfiles layout: `ray.data.read_binary_files`, decode and the training crop in
`map_batches`, `iter_torch_batches` (see ``recipes.ray_data``)."""

from .ray_data import ray_data_recipe

RECIPE = ray_data_recipe(name="ray-data-files", layout="rawfiles", loader="ray_data_files",
                         reader="ray.data.read_binary_files over one JPEG file per sample, "
                                "files shuffled; the path names index and class")
