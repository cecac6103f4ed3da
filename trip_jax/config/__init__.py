"""The config schema: sections (defaults, types, allowed values, help), the typed config an
entry point builds (typed), its checks and messages, migration of saved configs."""
