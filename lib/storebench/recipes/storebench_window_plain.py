"""storebench's crop-window recipe (``storebench_window``) with the plain bilinear filter,
two pixels a direction as tf.image.resize(antialias=False) samples: the recipe to set
beside tf.data, whose filter it is."""

import dataclasses

from .base import TransformTraits
from .storebench_window import RECIPE as WINDOW

RECIPE = dataclasses.replace(
    WINDOW,
    name="storebench-window-plain-lmdb",
    transform=TransformTraits("plain", "crop window",
                              "storebench RandomResizedCropFlip(filter='plain'), "
                              "decode='window' (its C plain bilinear resize into the batch)"),
    code=WINDOW.code.replace(
        '''dataset = LazyDataset(reader, decode="window", transform=RandomResizedCropFlip(),
                      output_shape=(224, 224, 3))''',
        '''dataset = LazyDataset(reader, decode="window", output_shape=(224, 224, 3),
                      transform=RandomResizedCropFlip(filter="plain"))'''),
)
