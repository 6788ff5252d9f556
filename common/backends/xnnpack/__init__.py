"""XNNPACK: the ops its partitioner takes, ``XNNPACKQuantizer``'s rules, what a .pte ran."""
