"""Where the shipped quality-filter thresholds come from: per-language derivation from score
distributions and the synthetic junk they must drop (``python -m data_prep.calibration.filter_defaults``)."""
