"""Static shapes, dtypes and batch axes of a frozen graph's tensors, and its fixed values.

    shapes.infer / shapes.batch_axes   TensorFlow's own shape functions over the graph,
                                       helped where they cannot see:
    loops.refine                       through functional loops
    lists.pin                          to lists stacked after a loop (`tf.map_fn`)
    tables.stand_in                    to table lookups (`StringLookup`)
    strings.stand_in                   after `tf.strings.split` (`TextVectorization`)
    stand_ins                          the stand-in nodes the three above build
    values                             which values are fixed, and which follow shapes

Used by the rewrites (`neuronish.rewrites`), the partitioner (`neuronish.partition`)
and the dynamic-shape checks (`neuronish.dynamic_ops`, `neuronish.shape_bounds`).
"""
