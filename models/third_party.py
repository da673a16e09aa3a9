"""Models nobody on the project wrote, as a new user would export them.

Every `keras.applications` model with random weights (`weights=None`) and
keras_hub text backbones in tiny configurations, each exported with Keras'
own `model.export(dir)`: the SavedModels the zoo benchmark (`benchmarks/zoo.py`)
and the whole-model tests compile. Seeds are fixed, so a model builds to the
same weights every time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from models import user_models  # noqa: E402

# Every application `keras.applications` offers (names of its model functions).
APPLICATIONS = tuple(sorted(
    n for n in dir(keras.applications) if n[:1].isupper() and callable(getattr(
        keras.applications, n))))

SEQ_LEN = 16
VOCAB = 500
_TINY = dict(num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64)


@dataclass(frozen=True)
class HubModel:
    """A keras_hub backbone: its class name, constructor arguments and integer inputs."""

    backbone: str
    kwargs: dict
    # input key -> exclusive upper bound of its values; None: the backbone's own inputs,
    # token ids bounded by the vocabulary, masks of leading ones, floats ~N(0, 1)
    inputs: dict[str, int] | None = None
    # input key -> its sequence length where SEQ_LEN does not fit (raw audio)
    lengths: dict[str, int] | None = None
    # input key -> its whole shape after the batch, where the backbone leaves more than a
    # sequence free (images per prompt, patches per image)
    shapes: dict[str, tuple[int, ...]] | None = None
    # batch -> values of the inputs random numbers would make meaningless (where a prompt's
    # image tokens go, each patch's grid position, token positions)
    feeds: Callable[[int], dict[str, np.ndarray]] | None = None


HUB_MODELS = {
    "bert_tiny": HubModel("BertBackbone", dict(vocabulary_size=VOCAB, max_sequence_length=64,
                                               **_TINY),
                          {"token_ids": VOCAB, "segment_ids": 2, "padding_mask": 2}),
    "distil_bert_tiny": HubModel("DistilBertBackbone", dict(vocabulary_size=VOCAB,
                                                            max_sequence_length=64, **_TINY),
                                 {"token_ids": VOCAB, "padding_mask": 2}),
    "roberta_tiny": HubModel("RobertaBackbone", dict(vocabulary_size=VOCAB,
                                                     max_sequence_length=64, **_TINY),
                             {"token_ids": VOCAB, "padding_mask": 2}),
    "albert_tiny": HubModel("AlbertBackbone", dict(vocabulary_size=VOCAB, embedding_dim=16,
                                                   num_groups=1, num_inner_repetitions=1,
                                                   max_sequence_length=64, **_TINY),
                            {"token_ids": VOCAB, "segment_ids": 2, "padding_mask": 2}),
    "gpt2_tiny": HubModel("GPT2Backbone", dict(vocabulary_size=VOCAB, max_sequence_length=64,
                                               **_TINY),
                          {"token_ids": VOCAB, "padding_mask": 2}),
}

_DECODER = dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=32,
                intermediate_dim=64, vocabulary_size=VOCAB)
IMAGE = 32  # image backbones: 32x32x3 inputs

# Further keras_hub backbones, inputs taken from the backbone itself.
HUB_MODELS.update({
    "deberta_v3_tiny": HubModel("DebertaV3Backbone", dict(vocabulary_size=VOCAB,
                                                          max_sequence_length=64,
                                                          bucket_size=8, **_TINY)),
    "electra_tiny": HubModel("ElectraBackbone", dict(vocab_size=VOCAB, embedding_dim=16,
                                                     max_sequence_length=64, **_TINY)),
    "xlm_roberta_tiny": HubModel("XLMRobertaBackbone", dict(vocabulary_size=VOCAB,
                                                            max_sequence_length=64, **_TINY)),
    "fnet_tiny": HubModel("FNetBackbone", dict(vocabulary_size=VOCAB, num_layers=2,
                                               hidden_dim=32, intermediate_dim=64,
                                               max_sequence_length=64)),
    "opt_tiny": HubModel("OPTBackbone", dict(vocabulary_size=VOCAB, max_sequence_length=64,
                                             **_TINY)),
    "gpt_neox_tiny": HubModel("GPTNeoXBackbone", dict(vocabulary_size=VOCAB,
                                                      max_sequence_length=64, **_TINY)),
    "bloom_tiny": HubModel("BloomBackbone", dict(vocabulary_size=VOCAB, **_TINY)),
    "falcon_tiny": HubModel("FalconBackbone", dict(vocabulary_size=VOCAB, num_layers=2,
                                                   num_attention_heads=2, hidden_dim=32,
                                                   intermediate_dim=64)),
    "llama_tiny": HubModel("LlamaBackbone", dict(_DECODER)),
    "llama3_tiny": HubModel("Llama3Backbone", dict(_DECODER)),
    "mistral_tiny": HubModel("MistralBackbone", dict(_DECODER)),
    "qwen2_tiny": HubModel("Qwen2Backbone", dict(_DECODER)),
    "qwen3_tiny": HubModel("Qwen3Backbone", dict(_DECODER, head_dim=8)),
    "phi3_tiny": HubModel("Phi3Backbone", dict(_DECODER)),
    "gemma_tiny": HubModel("GemmaBackbone", dict(_DECODER, head_dim=8)),
    "mixtral_tiny": HubModel("MixtralBackbone", dict(_DECODER, num_experts=4, top_k=2)),
    "roformer_v2_tiny": HubModel("RoformerV2Backbone", dict(vocabulary_size=VOCAB, head_size=16,
                                                            **_TINY)),
    "esm2_tiny": HubModel("ESM2Backbone", dict(vocabulary_size=VOCAB, **_TINY)),
    "bart_tiny": HubModel("BartBackbone", dict(vocabulary_size=VOCAB, max_sequence_length=64,
                                               **_TINY)),
    "t5_tiny": HubModel("T5Backbone", dict(vocabulary_size=VOCAB, **_TINY)),
    "whisper_tiny": HubModel("WhisperBackbone", dict(vocabulary_size=VOCAB, num_mels=16,
                                                     max_encoder_sequence_length=32,
                                                     max_decoder_sequence_length=64,
                                                     **_TINY)),
    "xlnet_tiny": HubModel("XLNetBackbone", dict(vocabulary_size=VOCAB, **_TINY)),
    "vit_tiny": HubModel("ViTBackbone", dict(image_shape=(IMAGE, IMAGE, 3), patch_size=8,
                                             num_layers=2, num_heads=2, hidden_dim=32,
                                             mlp_dim=64)),
    "deit_tiny": HubModel("DeiTBackbone", dict(image_shape=(IMAGE, IMAGE, 3), patch_size=8,
                                               **_TINY)),
    "dinov2_tiny": HubModel("DINOV2Backbone", dict(patch_size=8, num_layers=2, hidden_dim=32,
                                                   num_heads=2, intermediate_dim=64,
                                                   image_shape=(IMAGE, IMAGE, 3),
                                                   position_embedding_shape=(64, 64, 3))),
    "swin_tiny": HubModel("SwinTransformerBackbone", dict(image_shape=(IMAGE, IMAGE, 3),
                                                          embed_dim=16, depths=[2, 2],
                                                          num_heads=[2, 2], window_size=4,
                                                          patch_size=2)),
    "resnet_hub_tiny": HubModel("ResNetBackbone", dict(
        input_conv_filters=[64], input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 32], stackwise_num_blocks=[1, 1],
        stackwise_num_strides=[1, 2], block_type="basic_block", use_pre_activation=True,
        image_shape=(IMAGE, IMAGE, 3))),
    "resnet_hub_bottleneck": HubModel("ResNetBackbone", dict(
        input_conv_filters=[16], input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 32], stackwise_num_blocks=[1, 1],
        stackwise_num_strides=[1, 2], block_type="bottleneck_block",
        image_shape=(IMAGE, IMAGE, 3))),
    "cspdarknet_tiny": HubModel("CSPNetBackbone", dict(
        stem_filters=16, stem_kernel_size=3, stem_strides=1, stackwise_depth=[1, 1],
        stackwise_strides=[1, 2], stackwise_num_filters=[16, 32], block_type="dark_block",
        stage_type="dark",
        image_shape=(IMAGE, IMAGE, 3))),
    "mit_tiny": HubModel("MiTBackbone", dict(
        layerwise_depths=[1, 1], num_layers=2, layerwise_num_heads=[1, 2],
        layerwise_sr_ratios=[2, 1], max_drop_path_rate=0.0, layerwise_patch_sizes=[7, 3],
        layerwise_strides=[4, 2], hidden_dims=[16, 32], image_shape=(IMAGE, IMAGE, 3))),
    "densenet_hub_tiny": HubModel("DenseNetBackbone", dict(
        stackwise_num_repeats=[1, 1], growth_rate=8, image_shape=(IMAGE, IMAGE, 3))),
    "vgg_hub_tiny": HubModel("VGGBackbone", dict(
        stackwise_num_repeats=[1, 1], stackwise_num_filters=[8, 16],
        image_shape=(IMAGE, IMAGE, 3))),
    "xception_hub_tiny": HubModel("XceptionBackbone", dict(
        stackwise_conv_filters=[[8, 16], [32, 32], [32, 64]],
        stackwise_pooling=[False, True, False], image_shape=(IMAGE * 2, IMAGE * 2, 3))),
    "mobilenet_hub_tiny": HubModel("MobileNetBackbone", dict(
        stackwise_expansion=[[16, 24], [32]], stackwise_num_blocks=[2, 1],
        stackwise_num_filters=[[8, 8], [16]], stackwise_kernel_size=[[3, 3], [5]],
        stackwise_num_strides=[[2, 1], [2]], stackwise_se_ratio=[[None, None], [0.25]],
        stackwise_activation=[["relu", "relu"], ["hard_swish"]],
        stackwise_padding=[[1, 1], [2]], output_num_filters=32, depthwise_filters=8,
        depthwise_stride=2, depthwise_residual=False, last_layer_filter=32,
        squeeze_and_excite=0.5, image_shape=(IMAGE * 2, IMAGE * 2, 3))),
    # Backbones built around other backbones: a callable argument is built first.
    "segformer_tiny": HubModel("SegFormerBackbone", dict(
        image_encoder=lambda hub: hub.models.MiTBackbone(
            layerwise_depths=[1, 1], num_layers=2, layerwise_num_heads=[1, 2],
            layerwise_sr_ratios=[2, 1], max_drop_path_rate=0.0, layerwise_patch_sizes=[7, 3],
            layerwise_strides=[4, 2], hidden_dims=[16, 32], image_shape=(IMAGE, IMAGE, 3)),
        projection_filters=16)),
    "deeplab_v3_tiny": HubModel("DeepLabV3Backbone", dict(
        image_encoder=lambda hub: hub.models.ResNetBackbone(
            input_conv_filters=[64], input_conv_kernel_sizes=[7],
            stackwise_num_filters=[64, 32, 32], stackwise_num_blocks=[1, 1, 1],
            stackwise_num_strides=[1, 2, 2], block_type="basic_block",
            image_shape=(IMAGE * 2, IMAGE * 2, 3)),
        spatial_pyramid_pooling_key="P4", upsampling_size=4, dilation_rates=[2, 4],
        low_level_feature_key="P2", projection_filters=16,
        image_shape=(IMAGE * 2, IMAGE * 2, 3))),
    "clip_tiny": HubModel("CLIPBackbone", dict(
        vision_encoder=lambda hub: _clip("CLIPVisionEncoder", patch_size=8, hidden_dim=32,
                                         num_layers=2, num_heads=2, intermediate_dim=64,
                                         image_shape=(IMAGE, IMAGE, 3)),
        text_encoder=lambda hub: _clip("CLIPTextEncoder", vocabulary_size=VOCAB,
                                       embedding_dim=32, hidden_dim=32, num_layers=2,
                                       num_heads=2, intermediate_dim=64,
                                       max_sequence_length=SEQ_LEN),
        projection_dim=16)),
    "gemma3_tiny": HubModel("Gemma3Backbone", dict(_DECODER, head_dim=8, image_size=IMAGE)),
    "qwen3_moe_tiny": HubModel("Qwen3MoeBackbone", dict(_DECODER, head_dim=8,
                                                        moe_intermediate_dim=16,
                                                        num_experts=4, top_k=2)),
    "dinov3_tiny": HubModel("DINOV3Backbone", dict(patch_size=8, num_layers=2, hidden_dim=32,
                                                   num_heads=2, intermediate_dim=64,
                                                   image_shape=(IMAGE, IMAGE, 3))),
    "vitdet_tiny": HubModel("ViTDetBackbone", dict(hidden_size=32, num_layers=2,
                                                   intermediate_dim=64, num_heads=2,
                                                   global_attention_layer_indices=[1],
                                                   image_shape=(IMAGE * 2, IMAGE * 2, 3),
                                                   patch_size=8, num_output_channels=16,
                                                   window_size=4)),
    "moonshine_tiny": HubModel("MoonshineBackbone", dict(
        vocabulary_size=VOCAB, filter_dim=32, encoder_num_layers=1, decoder_num_layers=1,
        hidden_dim=32, intermediate_dim=64, encoder_num_heads=2, decoder_num_heads=2),
        lengths={"encoder_input_values": 1024, "encoder_padding_mask": 1024}),
    "gpt_oss_tiny": HubModel("GptOssBackbone", dict(_DECODER, num_experts=4, top_k=2,
                                                    head_dim=8)),
})

VISION_TOKENS = 4  # image tokens per prompt in the vision-language probes: one image of 2x2


def _vision_prompt(batch: int) -> dict[str, np.ndarray]:
    """One image per prompt whose tokens sit at positions 2..5 of every sequence: the
    indices the backbone scatters image embeddings to, and the mask saying where they are."""
    where = np.arange(2, 2 + VISION_TOKENS, dtype=np.int32)
    mask = np.zeros((batch, SEQ_LEN), np.int32)
    mask[:, where] = 1
    return {"vision_indices": np.tile(where, (batch, 1)), "vision_mask": mask}


def _gemma4_vision_prompt(batch: int) -> dict[str, np.ndarray]:
    """`_vision_prompt` plus what Gemma4's encoder takes besides pixels: each patch's (x, y)
    on the image's 6x6 grid of patches, and token positions 0..SEQ_LEN-1."""
    grid = np.stack(np.meshgrid(np.arange(6), np.arange(6), indexing="xy"), -1)
    return {**_vision_prompt(batch),
            "pixel_position_ids": np.tile(grid.reshape(1, 1, 36, 2), (batch, 1, 1, 1)).astype(
                np.int32),
            "position_ids": np.tile(np.arange(SEQ_LEN, dtype=np.int32), (batch, 1))}


def _gemma4_vision(hub: object) -> object:
    from keras_hub.src.models.gemma4.gemma4_vision_encoder import Gemma4VisionEncoder

    return Gemma4VisionEncoder(image_size=24, patch_size=4, num_heads=2, hidden_dim=16,
                               num_layers=1, intermediate_dim=32, head_dim=8, output_dim=32,
                               pool_size=3, position_embedding_size=32)


def _gemma3_vision(hub: object) -> object:
    from keras_hub.src.models.gemma3.gemma3_vision_encoder import Gemma3VisionEncoder

    return Gemma3VisionEncoder(image_size=16, patch_size=4, num_heads=2, hidden_dim=16,
                               num_layers=1, intermediate_dim=32, output_dim=32, pool_size=2)


def _siglip(encoder: str, **kwargs: object) -> object:
    from keras_hub.src.models.siglip import siglip_text_encoder, siglip_vision_encoder

    module = siglip_text_encoder if encoder == "SigLIPTextEncoder" else siglip_vision_encoder
    return getattr(module, encoder)(**kwargs)


# The keras_hub models that gave wrong numbers with no error at batches other than the
# compiled one (issue 26): vision-language backbones that read the batch size as a value
# (Gemma4's and Gemma3's interleaving of image tokens), a TensorArray written in a Python
# loop (RWKV7), and the others the fuzzing session tried as a user would.
HUB_MODELS.update({
    "gemma4_vision_tiny": HubModel(
        "Gemma4Backbone", dict(_DECODER, head_dim=8, image_size=24, vision_encoder=_gemma4_vision,
                               sliding_window_size=8, sliding_window_pattern=2),
        shapes={"pixel_values": (1, 36, 48), "pixel_position_ids": (1, 36, 2),
                "vision_indices": (VISION_TOKENS,)},
        feeds=_gemma4_vision_prompt),
    "gemma3_vision_tiny": HubModel(
        "Gemma3Backbone", dict(_DECODER, head_dim=8, image_size=16, vision_encoder=_gemma3_vision),
        shapes={"images": (1, 16, 16, 3), "vision_indices": (VISION_TOKENS,)},
        feeds=_vision_prompt),
    "rwkv7_tiny": HubModel("RWKV7Backbone", dict(hidden_size=32, head_size=8, num_layers=2,
                                                 vocabulary_size=VOCAB, intermediate_dim=64,
                                                 gate_lora=8, mv_lora=8, aaa_lora=8,
                                                 decay_lora=8)),
    "qwen3_5_tiny": HubModel("Qwen3_5Backbone", dict(
        _DECODER, head_dim=8, layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8)),
    "siglip_tiny": HubModel("SigLIPBackbone", dict(
        vision_encoder=lambda hub: _siglip("SigLIPVisionEncoder", patch_size=8, hidden_dim=32,
                                           num_layers=2, num_heads=2, intermediate_dim=64,
                                           image_shape=(IMAGE, IMAGE, 3)),
        text_encoder=lambda hub: _siglip("SigLIPTextEncoder", vocabulary_size=VOCAB,
                                         embedding_dim=32, hidden_dim=32, num_layers=2,
                                         num_heads=2, intermediate_dim=64,
                                         max_sequence_length=SEQ_LEN))),
    # an edge-residual stage, two universal inverted residuals, and a multi-query attention
    # block with its strided keys, fused across scales (MSFA) as Gemma3n's encoder is
    "mobilenetv5_tiny": HubModel("MobileNetV5Backbone", dict(
        stackwise_block_types=[["er"], ["uir", "uir"], ["uir", "mqa"]],
        stackwise_num_blocks=[1, 2, 2],
        stackwise_num_filters=[[16], [24, 24], [32, 32]],
        stackwise_strides=[[2], [2, 1], [2, 1]],
        stackwise_act_layers=[["relu"], ["gelu", "gelu"], ["gelu", "gelu"]],
        stackwise_exp_ratios=[[2.0], [2.0, 2.0], [2.0, 0.0]],
        stackwise_se_ratios=[[0.0], [0.0, 0.0], [0.0, 0.0]],
        stackwise_dw_kernel_sizes=[[0], [3, 3], [3, 0]],
        stackwise_dw_start_kernel_sizes=[[0], [3, 0], [3, 0]],
        stackwise_dw_end_kernel_sizes=[[0], [0, 0], [0, 0]],
        stackwise_exp_kernel_sizes=[[3], [0, 0], [0, 0]],
        stackwise_pw_kernel_sizes=[[1], [0, 0], [0, 0]],
        stackwise_num_heads=[[0], [0, 0], [0, 2]],
        stackwise_key_dims=[[0], [0, 0], [0, 8]],
        stackwise_value_dims=[[0], [0, 0], [0, 8]],
        stackwise_kv_strides=[[0], [0, 0], [0, 2]],
        stackwise_use_cpe=[[False], [False, False], [False, False]],
        stem_size=16, num_features=32, use_msfa=True, msfa_indices=(-2, -1),
        msfa_output_resolution=4, layer_scale_init_value=1e-5,
        image_shape=(IMAGE * 2, IMAGE * 2, 3))),
    "hgnetv2_tiny": HubModel("HGNetV2Backbone", dict(
        depths=[1, 1], embedding_size=16, hidden_sizes=[32, 64], stem_channels=[3, 8, 16],
        hidden_act="relu", use_learnable_affine_block=True,
        stackwise_stage_filters=[(16, 8, 32, 1, 2, 3), (32, 16, 64, 1, 2, 3)],
        apply_downsample=[False, True], use_lightweight_conv_block=[False, True],
        image_shape=(IMAGE, IMAGE, 3))),
    "smollm3_tiny": HubModel("SmolLM3Backbone", dict(
        vocabulary_size=VOCAB, hidden_dim=32, intermediate_dim=64, num_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attention_bias=False,
        attention_dropout=0.0, rope_layer_enabled_list=[True, False],
        layer_types=["attention", "attention"], mlp_bias=False, layer_norm_epsilon=1e-6,
        max_position_embeddings=64, rope_theta=10000.0, partial_rotary_factor=1.0)),
    # label queries: max_label_length + 1 = SEQ_LEN
    "parseq_tiny": HubModel("PARSeqBackbone", dict(
        image_encoder=lambda hub: hub.models.ViTBackbone(
            image_shape=(16, 32, 3), patch_size=(4, 8), num_layers=1, num_heads=2,
            hidden_dim=32, mlp_dim=64, use_class_token=False),
        vocabulary_size=VOCAB, max_label_length=SEQ_LEN - 1, decoder_hidden_dim=32,
        num_decoder_layers=1, num_decoder_heads=2, decoder_mlp_dim=64, dropout_rate=0.0,
        attention_dropout=0.0)),
    # 64x64 images: the neck's smallest reassembly (x0.5 of 8x8 patches) feeds a 3x3 conv
    "depth_anything_tiny": HubModel("DepthAnythingBackbone", dict(
        image_encoder=lambda hub: hub.models.DINOV2Backbone(
            patch_size=8, num_layers=4, hidden_dim=32, num_heads=2, intermediate_dim=64,
            image_shape=(IMAGE * 2, IMAGE * 2, 3), position_embedding_shape=(64, 64)),
        reassemble_factors=[4, 2, 1, 0.5], neck_hidden_dims=[8, 16, 16, 32],
        fusion_hidden_dim=16, head_hidden_dim=8, head_in_index=-1,
        feature_keys=["stage1", "stage2", "stage3", "stage4"])),
    # BASNet fixes its own widths (64 projection filters, 512 in the bridge): 49M
    # parameters however small the ResNet, but 32x32 images keep the arithmetic small
    "basnet_tiny": HubModel("BASNetBackbone", dict(
        image_encoder=lambda hub: hub.models.ResNetBackbone(
            input_conv_filters=[64], input_conv_kernel_sizes=[3],
            stackwise_num_filters=[64, 16, 32, 32], stackwise_num_blocks=[1, 1, 1, 1],
            stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block",
            image_shape=(None, None, 3)),
        num_classes=1, image_shape=(IMAGE, IMAGE, 3), projection_filters=64)),
    "t5gemma_tiny": HubModel("T5GemmaBackbone", dict(
        vocabulary_size=VOCAB, encoder_hidden_dim=32, encoder_intermediate_dim=64,
        encoder_num_layers=2, encoder_num_attention_heads=4, encoder_num_key_value_heads=2,
        encoder_head_dim=8, encoder_layer_types=["sliding_attention", "full_attention"],
        decoder_hidden_dim=32, decoder_intermediate_dim=64, decoder_num_layers=2,
        decoder_num_attention_heads=4, decoder_num_key_value_heads=2, decoder_head_dim=8,
        decoder_layer_types=["sliding_attention", "full_attention"], sliding_window=8)),
    "edrec_tiny": HubModel("EdRecBackbone", dict(vocab_size=VOCAB, num_layers_enc=2,
                                                 num_layers_dec=2, hidden_dim=32,
                                                 intermediate_dim=64, num_heads=2)),
})
ALL = (*APPLICATIONS, *HUB_MODELS, *user_models.NAMES)
PROBE = (*(n for n in HUB_MODELS if HUB_MODELS[n].inputs is None), *user_models.NAMES)


def build(name: str, target: str) -> None:
    """Build model `name` (an application or a `HUB_MODELS` key) and export it to `target`."""
    keras.utils.set_random_seed(0)
    if name in user_models.NAMES:
        user_models.build(name, target)
    else:
        model = keras_model(name)
        specs = [_hub_input_specs(name, model)] if name in HUB_MODELS else None
        model.export(target, verbose=False, input_signature=specs)


def keras_model(name: str) -> keras.Model:
    """The Keras model `build` exports for an application or a `HUB_MODELS` key, built under
    the current dtype policy (`models/float64.py` builds it in float64)."""
    if name in HUB_MODELS:
        return _hub_backbone(HUB_MODELS[name])
    if name in APPLICATIONS:
        return _application(name)
    raise KeyError(f"unknown model {name!r}; known: {', '.join(ALL)}")


def _application(name: str) -> keras.Model:
    """`keras.applications.<name>(weights=None)`, returning logits: with random weights the
    features of most of these networks shrink to ~1e-11 by the last layer, so a softmax
    output is exactly uniform and would match anything; the logits still carry every
    layer's numbers. A model whose default input size is free (MobileNetV3) gets 224x224."""
    build = getattr(keras.applications, name)
    model = build(weights=None, classifier_activation=None)
    if any(d is None for d in model.input_shape[1:]):
        model = build(weights=None, classifier_activation=None, input_shape=(224, 224, 3))
    return model


def _hub_backbone(spec: HubModel) -> keras.Model:
    import keras_hub

    kwargs = {k: v(keras_hub) if callable(v) else v for k, v in spec.kwargs.items()}
    return getattr(keras_hub.models, spec.backbone)(**kwargs)


def _hub_input_specs(name: str, model: keras.Model) -> object:
    """A fixed sequence length: the device compiles static shapes (the batch stays free)."""
    import tensorflow as tf

    spec = HUB_MODELS[name]
    if spec.inputs is not None:
        return {k: tf.TensorSpec([None, SEQ_LEN], "int32", name=k) for k in spec.inputs}
    return _input_specs(model, spec.lengths or {}, spec.shapes or {})


def _clip(encoder: str, **kwargs: object) -> object:
    from keras_hub.src.models.clip import clip_text_encoder, clip_vision_encoder

    module = clip_text_encoder if encoder == "CLIPTextEncoder" else clip_vision_encoder
    return getattr(module, encoder)(**kwargs)


def _input_specs(model: object, lengths: dict[str, int],
                 shapes: dict[str, tuple[int, ...]]) -> object:
    """The backbone's inputs with the batch left free and every other unknown dim fixed:
    `shapes[name]` or `lengths[name]` if given, else SEQ_LEN for sequences (audio frames:
    twice that), IMAGE for image sides."""
    import tensorflow as tf

    def spec(t: object, name: str) -> object:
        if name in shapes:
            return tf.TensorSpec([None, *shapes[name]], t.dtype, name=name)
        dims = list(t.shape)
        for i in range(1, len(dims)):
            if dims[i] is None and i == 1 and name in lengths:
                dims[i] = lengths[name]
            elif dims[i] is None:
                dims[i] = IMAGE if len(dims) == 4 else (2 * SEQ_LEN if "features" in name
                                                        else SEQ_LEN)
        return tf.TensorSpec([None, *dims[1:]], t.dtype, name=name)

    inputs = model.input
    if isinstance(inputs, dict):
        return {k: spec(t, k) for k, t in inputs.items()}
    return spec(inputs, "inputs")


def example_inputs(name: str, signature: Callable, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Valid random inputs for `signature` (a loaded SavedModel signature) at `batch`:
    floats ~N(0, 1); token ids within the vocabulary; padding masks mostly ones."""
    rng = np.random.default_rng(seed)
    _, specs = signature.structured_input_signature
    highs = (HUB_MODELS[name].inputs if name in HUB_MODELS else None) or user_models.INT_HIGHS
    given = HUB_MODELS[name].feeds if name in HUB_MODELS else None
    feeds = {k: v for k, v in given(batch).items() if k in specs} if given else {}
    for key, spec in sorted(specs.items()):
        if key in feeds:
            continue
        shape = [batch if d is None else d for d in spec.shape.as_list()]
        dtype = spec.dtype.as_numpy_dtype
        if spec.dtype == "string":  # words of the user models' vocabularies, and others
            feeds[key] = rng.choice(np.array([b"cat", b"dog", b"fish", b"owl"]), shape)
        elif spec.dtype.is_floating:
            feeds[key] = rng.standard_normal(shape).astype(dtype)
        elif key.endswith("padding_mask"):  # leading ones, then a random tail of padding
            keep = rng.integers(SEQ_LEN // 2, SEQ_LEN + 1, size=(shape[0], 1))
            feeds[key] = (np.arange(shape[1])[None, :] < keep).astype(dtype)
        else:
            high = highs.get(key, VOCAB if key.endswith("token_ids") else 2)
            feeds[key] = rng.integers(0, high, shape).astype(dtype)
    return feeds
