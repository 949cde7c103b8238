"""Contract 2 (training/CHECKPOINT.md): the run folder, its checkpoints and their metadata, what is
kept, loading any layout in one process, resharding and resuming on another layout."""
