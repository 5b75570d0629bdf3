"""Recorded tuning spaces (Kernel Tuner cache files) and the replay target's problem synthesis.

A cache file holds the measured result of every configuration of a real GPU kernel; `load_space` reads one
(with the hub's T1 file beside it for the constraints) and `RecordedSpace.family()` makes it searchable by every
strategy. The replay target (kfactory.targets.replay.target) serves the recorded results through the whole pipeline.
"""
from kfactory.targets.replay.cache import RecordedSpace, Record, load_space

__all__ = ["Record", "RecordedSpace", "load_space"]
