"""The config schema: sections (defaults, types, allowed values, help), checks, migration."""
