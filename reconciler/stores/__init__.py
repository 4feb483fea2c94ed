"""Where a unit lives: the state directory and etcd, behind one interface."""
