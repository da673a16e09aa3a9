"""The variants a user brings of the models the zoo covers (`models/third_party.py` exports
`keras.applications.X(weights=None, classifier_activation=None)` with `model.export` and
compiles it at batch 1): the default softmax head, `include_top=False` with each
pooling, other input sizes, free image sides, `tf.saved_model.save` instead of
`model.export`, a `keras.export.ExportArchive` with two endpoints, a `tf.Module` with two
signatures, compiled at batch 4 and called at 1, 3, 8 and 9, and keras_hub task models
without preprocessors. `benchmarks/probe_models.py` runs them: each compiles with
`Variant.compile_kwargs`, and every signature of the compiled model is compared with
TensorFlow at each of `Variant.batches`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import keras
import numpy as np
import tensorflow as tf

VOCAB = 500
SEQ_LEN = 16


@dataclass(frozen=True)
class Variant:
    save: Callable[[str], None]                    # writes the SavedModel to a directory
    compile_kwargs: dict = field(default_factory=dict)
    batches: tuple[int, ...] = (1, 3)
    free_size: int = 160                           # the size fed for a free dimension


def _app(name: str, **kwargs: object) -> keras.Model:
    keras.utils.set_random_seed(0)
    return getattr(keras.applications, name)(weights=None, **kwargs)


def _export(build: Callable[[], keras.Model]) -> Callable[[str], None]:
    return lambda target: build().export(target, verbose=False)


def _tf_save(build: Callable[[], keras.Model]) -> Callable[[str], None]:
    return lambda target: tf.saved_model.save(build(), target)


def _archive(target: str) -> None:
    """MobileNetV2 with two endpoints: logits (`serve`) and pooled features."""
    model = _app("MobileNetV2", classifier_activation=None, input_shape=(96, 96, 3))
    features = keras.Model(model.input, model.get_layer("global_average_pooling2d").output)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(features)
    spec = [tf.TensorSpec([None, 96, 96, 3], tf.float32, name="image")]
    archive.add_endpoint("serve", model.call, input_signature=spec)
    archive.add_endpoint("features", features.call, input_signature=spec)
    archive.write_out(target, verbose=False)


def _two_signatures(target: str) -> None:
    """A tf.Module with a small CNN behind two signatures: logits and probabilities."""
    keras.utils.set_random_seed(0)
    cnn = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
    module = tf.Module()
    module.cnn = cnn
    spec = tf.TensorSpec([None, 32, 32, 3], tf.float32, name="image")

    @tf.function(input_signature=[spec])
    def logits(image: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"logits": cnn(image)}

    @tf.function(input_signature=[spec])
    def probs(image: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"probs": tf.nn.softmax(cnn(image) * 10.0)}

    tf.saved_model.save(module, target, signatures={"logits": logits, "probs": probs})


def _behind_resizing() -> keras.Model:
    base = _app("MobileNetV2", include_top=False, pooling="avg", input_shape=(96, 96, 3))
    return keras.Sequential([keras.Input((128, 128, 3)), keras.layers.Resizing(96, 96), base,
                             keras.layers.Dense(3)])


def _bert_classifier() -> keras.Model:
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2,
                                             hidden_dim=32, intermediate_dim=64,
                                             max_sequence_length=64)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=3, preprocessor=None)


def _image_classifier(pooling: str) -> Callable[[], keras.Model]:
    def build() -> keras.Model:
        import keras_hub

        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.ResNetBackbone(
            input_conv_filters=[64], input_conv_kernel_sizes=[7], stackwise_num_filters=[64, 32],
            stackwise_num_blocks=[1, 1], stackwise_num_strides=[1, 2], block_type="basic_block",
            use_pre_activation=True, image_shape=(32, 32, 3))
        return keras_hub.models.ImageClassifier(backbone, num_classes=5, preprocessor=None,
                                                pooling=pooling)
    return build


_SIDES_224 = {"model_shape_feed_dict": {"keras_tensor": [1, 224, 224, 3]}}
_TEXT_SHAPES = {k: [1, SEQ_LEN] for k in ("padding_mask", "segment_ids", "token_ids")}

VARIANTS: dict[str, Variant] = {
    # the default head: softmax
    "ResNet50_softmax": Variant(_export(lambda: _app("ResNet50"))),
    "InceptionV3_softmax": Variant(_export(lambda: _app("InceptionV3"))),
    # no head, each pooling: without input_shape Keras leaves the image sides free, so the
    # compile is given them (without, it names the input and what to pass)
    "ResNet50_notop_avg": Variant(_export(lambda: _app("ResNet50", include_top=False,
                                                       pooling="avg")), _SIDES_224, free_size=224),
    "EfficientNetB0_notop_max": Variant(_export(lambda: _app("EfficientNetB0", include_top=False,
                                                             pooling="max")), _SIDES_224,
                                        free_size=224),
    "ConvNeXtTiny_notop_maps": Variant(_export(lambda: _app("ConvNeXtTiny", include_top=False)),
                                       _SIDES_224, free_size=224),
    "MobileNetV3Small_notop_avg": Variant(_export(lambda: _app(
        "MobileNetV3Small", include_top=False, pooling="avg", input_shape=(224, 224, 3)))),
    # other input sizes
    "MobileNet_96": Variant(_export(lambda: _app("MobileNet", classifier_activation=None,
                                                 input_shape=(96, 96, 3)))),
    "MobileNetV3Small_notop_96": Variant(_export(lambda: _app(
        "MobileNetV3Small", include_top=False, input_shape=(96, 96, 3)))),
    "DenseNet121_160": Variant(_export(lambda: _app("DenseNet121", classifier_activation=None,
                                                    input_shape=(160, 160, 3)))),
    "InceptionV3_160": Variant(_export(lambda: _app("InceptionV3", classifier_activation=None,
                                                    input_shape=(160, 160, 3)))),
    "ResNet50V2_299": Variant(_export(lambda: _app("ResNet50V2", classifier_activation=None,
                                                   input_shape=(299, 299, 3)))),
    # free image sides: compiled for 160x160 (model_shape_feed_dict), called at 160x160
    "MobileNetV2_free_160": Variant(
        _export(lambda: _app("MobileNetV2", include_top=False, pooling="avg",
                             input_shape=(None, None, 3))),
        {"model_shape_feed_dict": {"keras_tensor": [1, 160, 160, 3]}}),
    # Resizing in front: Keras then serves BatchNormalization on the batch's statistics
    # (its moving-average writes are left out; the batch reductions stay on TensorFlow)
    "MobileNetV2_behind_resizing": Variant(_export(_behind_resizing), batches=(1, 3, 4)),
    # saved with tf.saved_model.save
    "EfficientNetB0_tf_save": Variant(_tf_save(lambda: _app("EfficientNetB0",
                                                            classifier_activation=None))),
    "Xception_tf_save": Variant(_tf_save(lambda: _app("Xception", classifier_activation=None))),
    # compiled at batch 4, called at 1, 3, 8, 9 (padded, split)
    "ResNet50_batch4": Variant(_export(lambda: _app("ResNet50", classifier_activation=None)),
                               {"batch_size": 4}, (1, 3, 8, 9)),
    "NASNetMobile_batch4": Variant(_export(lambda: _app("NASNetMobile",
                                                        classifier_activation=None)),
                                   {"batch_size": 4}, (1, 3, 8, 9)),
    # several signatures
    "mobilenet_v2_archive": Variant(_archive),
    "module_two_signatures": Variant(_two_signatures),
    # keras_hub task models without preprocessors
    "bert_text_classifier": Variant(_export(_bert_classifier),
                                    {"model_shape_feed_dict": _TEXT_SHAPES}, free_size=SEQ_LEN),
    "bert_text_classifier_batch2": Variant(
        _export(_bert_classifier),
        {"batch_size": 2, "model_shape_feed_dict": {k: [2, SEQ_LEN] for k in _TEXT_SHAPES}},
        (1, 3, 8, 9), free_size=SEQ_LEN),
    "resnet_image_classifier": Variant(_export(_image_classifier("avg"))),
    "resnet_image_classifier_max": Variant(_export(_image_classifier("max"))),
}


def example_inputs(name: str, signature: Callable, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Random inputs for `signature` at `batch`, free dimensions at the variant's size:
    floats ~N(0, 1), token ids within the vocabulary, segment ids 0/1, masks of leading
    ones."""
    size = VARIANTS[name].free_size
    rng = np.random.default_rng(seed)
    _, specs = signature.structured_input_signature
    feeds = {}
    for key, spec in sorted(specs.items()):
        shape = [batch if i == 0 else size if d is None else d
                 for i, d in enumerate(spec.shape.as_list())]
        dtype = spec.dtype.as_numpy_dtype
        if spec.dtype.is_floating:
            feeds[key] = rng.standard_normal(shape).astype(dtype)
        elif key.endswith("padding_mask"):
            keep = rng.integers(shape[1] // 2, shape[1] + 1, size=(shape[0], 1))
            feeds[key] = (np.arange(shape[1])[None, :] < keep).astype(dtype)
        else:
            feeds[key] = rng.integers(0, VOCAB if key.endswith("token_ids") else 2,
                                      shape).astype(dtype)
    return feeds
