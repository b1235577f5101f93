package main

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// notDumpable marks the process not dumpable before anything reads a key:
// then only a process with CAP_SYS_PTRACE may read its memory
// (/proc/<pid>/mem, ptrace), even one of the same uid, and no core file is
// written. The agent holds the private keys of every identity it serves
// (in node mode, of every pod of its node).
func notDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	return nil
}
