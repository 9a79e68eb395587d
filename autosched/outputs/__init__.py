"""What a run leaves: records, CSV and run.log, the tuning spec, paths."""
