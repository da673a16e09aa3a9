"""The io-config the TensorFlow side writes (`neuronish.contracts.io_config`) is the one
the compiler reads (`cc/ioconfig.py`): every field arrives as it was given."""

from __future__ import annotations

import json

from neuronish import contracts
from neuronish.cc.ioconfig import parse_io_config
from neuronish.runtime.signature import TensorSignature


def test_what_the_tensorflow_side_writes_the_compiler_reads_back() -> None:
    written = contracts.io_config(
        [("x:0", (8, 224, 224, 3), "float32", 0), ("ids:0", [128, 8], "int32", 1),
         ("scale:0", (), "float32", -1)],
        {"logits:0": 0, "pooled:0": None, "table:0": -1})
    config = parse_io_config(json.dumps(written))  # through JSON, as the driver passes it
    assert not config.problems
    assert config.inputs == (TensorSignature("x:0", "float32", (8, 224, 224, 3), 0),
                             TensorSignature("ids:0", "int32", (128, 8), 1),
                             TensorSignature("scale:0", "float32", (), -1))
    assert config.given_batch_axes == {"x:0", "ids:0", "scale:0"}
    assert config.outputs == ("logits:0", "pooled:0", "table:0")
    assert config.output_batch_axes == (0, None, -1)
