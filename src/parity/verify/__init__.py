"""Verification: tier 1 (tensors), tier 2 (activations, localization), tier 3 (tasks)."""
