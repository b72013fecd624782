// Command pause is the pod sandbox ("pause") image of the end-to-end tests: nothing can be pulled there,
// so the harness builds this static binary into an image of its own. Like Kubernetes' pause, it holds the
// pod's namespaces, reaps the children that are reparented to it, and exits on SIGTERM or SIGINT. With -v it
// prints its version and exits, as Kubernetes' pause does: kubeadm upgrade's health-check Job runs it so.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (konnect e2e)")
		return
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
