"""Small dependency-free helpers both sides of the process boundary use.

The TensorFlow side never imports the compiler in-process and the compiler never
imports TensorFlow (docs/contracts.md); what both need beyond `neuronish.contracts`
lives here, importing nothing but the standard library: protobuf's wire format
without a schema (`protowire`) and pausing Python's cyclic collector over large,
long-lived graphs (`nogc`).
"""
