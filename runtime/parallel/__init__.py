"""The parallel transforms, applied in torchtitan's order: stage split, TP, recomputation, DP/FSDP, PipelineStage."""
