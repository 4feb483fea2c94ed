"""Documents and values: the typed, frozen inputs (SPEC §3-§4), amounts and inventories, and
their JSON Schema. Pure."""
