"""A model run in four stages, each handing a typed result to the next (`results.py`):
prepare (lower, find the problems, dump IREE's dispatches), search (the IREE route's
campaign and the custom route), decide (the spec, the custom winners, the proof) and report
(console, summary JSON, tables). All a model run prints goes through `report.py`."""
