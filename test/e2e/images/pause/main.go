// Command pause is the pod sandbox's process for the end-to-end cluster (containerd's
// sandbox_image): it holds the pod's namespaces, reaps orphans, and exits on SIGTERM or
// SIGINT. Built as a static binary into a one-layer image; no registry is reachable.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
