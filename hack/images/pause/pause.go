// Command pause holds a pod's namespaces for containerd (the "sandbox image"): it waits for
// SIGINT or SIGTERM and reaps any zombie it inherits as PID 1 meanwhile. Built statically by
// hack/images/images.py, because the registry.k8s.io pause image cannot be pulled here.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
