"""Offline predictions from the same call plan the profile counts: peak memory per stage
(``memory``), GPUs' datasheet figures (``gpus``)."""
