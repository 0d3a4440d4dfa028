"""The suite's support code: the tier plugin (:mod:`support.tiers`) and the modules whose
fixtures start processes (registered by it only for the tiers that run them)."""
