"""The node agent (SPEC §15): applies its node's plan with runc and restarts what died."""
