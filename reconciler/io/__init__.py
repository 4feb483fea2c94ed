"""The shell's file side: the safe YAML reader, the loader, atomic writes, last-good versions,
the lock, signals."""
