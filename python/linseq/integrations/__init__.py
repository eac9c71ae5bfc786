"""linseq inside other people's frameworks: the model libraries and kernel registries that
look their kernels up by name, pointed at linseq's. Each sub-module is imported on demand and
imports its framework only when called.
"""
