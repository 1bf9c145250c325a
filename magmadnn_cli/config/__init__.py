"""The config: the pydantic schema (no numpy) and YAML loading with line numbers and --set overrides."""
