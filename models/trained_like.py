"""A keras.applications model whose BatchNorms look trained, exported as a user would.

    python -m models.trained_like DenseNet121 OUT_DIR

Fresh weights (`weights=None`) give every BatchNorm gamma 1, beta 0, mean 0 and variance
1: its shift is zero and folds away, so benchmarks on such models never see the shift a
trained model has after a concat or a pool (DenseNet, ResNetV2). Here gamma, beta, mean
and variance are drawn at random (seeded) in the ranges trained networks show, and the
rest is `models.third_party`'s model. An input Normalization left to `adapt` (EfficientNet's)
gets ImageNet's mean and variance, as `weights="imagenet"` loads them; with fresh weights
it is x - 0 / 1 and folds away. Measure it with `benchmarks/peers.py --models NAME
--saved-model NAME=OUT_DIR`.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def build(name: str, target: str, seed: int = 0) -> int:
    """Export application `name` with trained-like BatchNorm statistics to `target` (a
    new directory, written in a temporary one and renamed); the number of BatchNorms."""
    import keras

    from models.third_party import APPLICATIONS, keras_model

    if name not in APPLICATIONS:
        raise SystemExit(f"unknown application {name!r}; known: {', '.join(APPLICATIONS)}")
    if os.path.exists(target):
        raise SystemExit(f"{target} already exists; remove it or choose another directory")
    keras.utils.set_random_seed(seed)
    model = keras_model(name)
    rng = np.random.default_rng(seed)
    norms = [layer for layer in model.layers
             if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in norms:
        c = layer.get_weights()[-1].shape[0]
        weights = ([rng.uniform(0.5, 1.5, c).astype(np.float32)] if layer.scale else []) + \
            ([rng.normal(0.0, 0.1, c).astype(np.float32)] if layer.center else [])  # gamma, beta
        layer.set_weights(weights + [rng.normal(0.0, 0.1, c).astype(np.float32),   # mean
                                     rng.uniform(0.5, 2.0, c).astype(np.float32)])  # variance
    for layer in model.layers:
        if isinstance(layer, keras.layers.Normalization) and layer.get_weights():
            mean, variance, count = layer.get_weights()
            layer.set_weights([IMAGENET_MEAN.reshape(mean.shape),
                               (IMAGENET_STD ** 2).reshape(variance.shape), count])
    partial = f"{target}.partial-{os.getpid()}"
    model.export(partial, verbose=False)
    os.rename(partial, target)
    return len(norms)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a keras.applications name, e.g. DenseNet121")
    p.add_argument("out", help="the SavedModel directory to write")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    count = build(args.model, args.out, args.seed)
    print(f"{args.out}: {args.model} with {count} trained-like BatchNorms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
