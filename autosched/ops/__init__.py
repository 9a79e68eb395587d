"""Root-op kinds: how each is recognised, its problem, its kernel module."""
