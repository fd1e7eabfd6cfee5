"""Loggers: where a run's metrics go besides its metrics.csv."""
