//go:build !race

package udsserver

// raceEnabled: the race detector changes what memory is measured.
const raceEnabled = false
