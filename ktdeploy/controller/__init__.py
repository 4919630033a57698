"""The controller layer: see docs/architecture.md."""
