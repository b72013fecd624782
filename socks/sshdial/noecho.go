//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package sshdial

import "golang.org/x/sys/unix"

// noEcho turns the terminal fd's echo off, discarding what was typed before, and returns what turns it back
// on. It is called before the prompt is shown, as OpenSSH's readpassphrase does (TCSAFLUSH):
// term.ReadPassword turns echo off only after a prompt written before it, so an answer typed as soon as
// the prompt showed could be echoed. The line stays canonical: the terminal edits it.
func noEcho(fd int) (restore func(), err error) {
	old, err := unix.IoctlGetTermios(fd, getTermios)
	if err != nil {
		return nil, err
	}
	quiet := *old
	quiet.Lflag &^= unix.ECHO
	quiet.Lflag |= unix.ICANON | unix.ISIG
	quiet.Iflag |= unix.ICRNL
	if err := unix.IoctlSetTermios(fd, setTermiosFlush, &quiet); err != nil {
		return nil, err
	}
	return func() { _ = unix.IoctlSetTermios(fd, setTermios, old) }, nil
}
