"""The controller (SPEC §12-§14): one reconcile, the watcher, leader election and the status
report."""
