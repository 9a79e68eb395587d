"""One run's candidates: builds, trials, re-timing, the problem's life."""
