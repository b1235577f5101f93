//go:build !race

package xdsproxy

// raceEnabled lets heavy tests shrink under the race detector.
const raceEnabled = false
