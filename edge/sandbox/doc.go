// Package sandbox confines task processes: the network egress of every
// task (NFTables: a task's sockets leave only through loopback, where the
// secrets proxy listens), and each task's own process tree (Init: its own
// PID and mount namespaces, private /tmp, /var/tmp and /dev/shm, a /proc of
// its own, and no privileges left before the agent runs).
package sandbox
