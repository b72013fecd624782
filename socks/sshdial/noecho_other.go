//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package sshdial

import "errors"

// noEcho is not done here: readTerminal falls back to term.ReadPassword.
func noEcho(int) (func(), error) { return nil, errors.ErrUnsupported }
