"""Manifests: YAML with positions, schema validation, cross-reference checks, the catalog."""
