"""Tuning before training: the learning-rate range test and the batch-size finder (configs/tuning/)."""
