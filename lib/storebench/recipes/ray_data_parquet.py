"""Ray Data over the parquet layout: `ray.data.read_parquet`, decode and the training crop in
`map_batches`, `iter_torch_batches` (see ``recipes.ray_data``)."""

from .ray_data import ray_data_recipe

RECIPE = ray_data_recipe(name="ray-data-parquet", layout="parquet", loader="ray_data_parquet",
                         reader="ray.data.read_parquet over one Parquet file "
                                "(one file: rows in stored order into the local shuffle "
                                "buffer; include_row_hash gives the row's position)")
