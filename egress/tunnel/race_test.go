//go:build race

package tunnel

// raceDetector is on: it makes the server many times slower, so that bounds on how soon something happens
// under load are checked only without it.
const raceDetector = true
