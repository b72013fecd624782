//go:build !linux

package sshdial

import "syscall"

// killTree kills process pid; its descendants, which only Linux's /proc lists here, keep running.
func killTree(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
