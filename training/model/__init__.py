"""The model, written once as single-device code: BLOOM (ALiBi, embedding LayerNorm, tied
embedding) and its attention kernels. Parallelism is applied from outside (training/parallel/)."""
