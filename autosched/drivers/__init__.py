"""What a command does end to end: a model run, the proof, simulation."""
