"""The core layer: see docs/architecture.md."""
