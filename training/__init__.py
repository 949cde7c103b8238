"""The 3D-parallel BLOOM trainer (megatron-core TP + DeepSpeed PP + ZeRO DP)."""
