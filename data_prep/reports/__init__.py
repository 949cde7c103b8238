"""What the quality filter did, read back from the recorded scores: the filter report and the exact
quantiles it is built on."""
