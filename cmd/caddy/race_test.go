//go:build race

package main

// raceEnabled says that this test binary has the race detector.
const raceEnabled = true
