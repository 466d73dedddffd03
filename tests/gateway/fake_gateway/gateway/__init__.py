"""A stand-in for the Hermes gateway package, just large enough for hooks to patch and reach."""
