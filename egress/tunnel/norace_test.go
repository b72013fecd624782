//go:build !race

package tunnel

// raceDetector is off: see race_test.go.
const raceDetector = false
