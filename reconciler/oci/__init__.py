"""OCI runtime configs (SPEC §11): the pure builder, the host-device probe and the writer of
out/instances."""
