"""Rewrites of a frozen graph, run before partitioning, into ops the device runs.

Each module rewrites one kind of thing and returns its input unchanged when it does
not apply; `rewrite.rewrite_for_device` runs them in order:

    fold.fold_constants              values computed from constants alone, as Consts
    unroll.unroll_loops              loops whose trip count the shapes fix, unrolled
    complex_pairs.complex_as_pairs   complex values between real tensors, as real pairs
    rewrite.rewrite_for_device       all of the above, then segment sums and folded
                                     layer norms, in order

They read the graph through `neuronish.graph` and type it with
`neuronish.shape_inference`; the partitioner (`neuronish.partition`) sees their result.
"""
