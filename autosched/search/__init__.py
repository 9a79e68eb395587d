"""The search: spaces, tuners, the loop, history, landscapes and replay."""
