"""Helpers shared by the tests of every tier: service fixtures' logic, workloads, fakes, oracles."""
