"""A zoo of models written elsewhere, ported to Flax NNX in the form their sources use.

Each module names its source (repository and path) and what was shrunk to run on a 2-core CPU; the
point is to train jaxtrain on models as users write them (RNG streams held in Dropout layers or
passed per call, BatchNorm statistics, `nnx.RNN`, raw-array buffers, custom Variable types, NaN
labels, one-hot labels, probabilities out of the model). `ZOO` maps each name to its `ZooModel`;
`hand.py` holds the hand-written training loops the sources use, to compare `jaxtrain.fit` against.
"""

from benchmarks.zoo import (
    flax_mnist_cnn,
    gnn,
    keras_convnet,
    lm1b,
    mixer,
    nanogpt,
    resnet,
    spectral_norm,
    sst2_lstm,
    unet,
    vae,
    vit,
)
from benchmarks.zoo.base import ZooModel

ZOO: dict[str, ZooModel] = {
    m.MODEL.name: m.MODEL
    for m in (flax_mnist_cnn, keras_convnet, resnet, vit, lm1b, sst2_lstm, mixer, vae, unet, nanogpt, gnn,
              spectral_norm)
}

__all__ = ["ZOO", "ZooModel"]
