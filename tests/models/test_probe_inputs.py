"""The probe set's structured inputs (models/third_party.py): the vision-language
backbones get image tokens where their masks say, in the shapes their specs declare."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from models import third_party


@pytest.mark.parametrize("name", ["gemma4_vision_tiny", "gemma3_vision_tiny"])
def test_vision_prompts_fit_their_specs_at_every_batch(name: str) -> None:
    spec = third_party.HUB_MODELS[name]
    signature = {k: tf.TensorSpec([None, *shape], tf.int32 if "ids" in k or "vision" in k
                                  else tf.float32, name=k)
                 for k, shape in {**spec.shapes, "token_ids": (third_party.SEQ_LEN,),
                                  "padding_mask": (third_party.SEQ_LEN,),
                                  "vision_mask": (third_party.SEQ_LEN,),
                                  **({"position_ids": (third_party.SEQ_LEN,)}
                                     if name.startswith("gemma4") else {})}.items()}
    fn = tf.function(lambda **kw: kw).get_concrete_function(**signature)
    for batch in (1, 3, 5):
        feeds = third_party.example_inputs(name, fn, batch, seed=batch)
        assert set(feeds) == set(signature)
        for key, value in feeds.items():
            assert value.shape == (batch, *signature[key].shape[1:]), key
        # every image token's position is marked in the mask, and nothing else is
        rows = np.arange(batch)[:, None]
        assert feeds["vision_mask"][rows, feeds["vision_indices"]].all()
        assert feeds["vision_mask"].sum() == feeds["vision_indices"].size
        # the image tokens sit where the padding mask keeps tokens
        assert feeds["padding_mask"][rows, feeds["vision_indices"]].all()
