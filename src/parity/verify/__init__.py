"""Verification: tier 1 (tensors) and the failure taxonomy."""
