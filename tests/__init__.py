"""The tests in three tiers: unit/ (no server), integration/ (one server at a time) and
system/ (the whole job); helpers in support/."""
