// Package sandbox confines task processes: the network egress of every
// task (NFTables: a task's sockets leave only through loopback, where the
// secrets proxy listens), and each task's own process tree (Init: its own
// PID, mount and IPC namespaces, private /tmp, /var/tmp, /dev/shm and
// /run/lock, an empty /run hiding the host's Unix sockets, a /proc and
// message queues of its own, the system trust store
// reading through to the task's trust file, descriptors 0-2 alone, and no
// privileges left before the agent runs).
package sandbox
